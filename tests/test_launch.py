"""`odin-ns-train` failures end with one line, last: `odin-ns-train: error: <reason>`.

Bad input is caught by the launcher's preflight before torchrun starts any rank, so no
output folder exists afterwards (one case through the ``odin-ns-train`` script, the others
through the same preflight in this process); a rank that fails after spawn has its reason
printed after
torchrun's own report.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from harness.runs import launch_in_process

from odin_ns import launch
from odin_ns.bench.commands import BIN, free_port, run_env

PREFIX = "odin-ns-train: error: "


def _launch(
    cwd: Path, nproc: int, *train_args: str, start_method: str = "auto", temp: Path | None = None
) -> tuple[int, list[str]]:
    """Run odin-ns-train in ``cwd`` (``temp``: its temp folder); its exit code and output
    lines (stderr+stdout, in order)."""
    cmd = [str(BIN / "odin-ns-train"), "--nproc-per-node", str(nproc)]
    cmd += ["--start-method", start_method]
    cmd += ["--master-port", str(free_port()), "odin-splatfacto", *train_args]
    cmd += ["--vis", "tensorboard"]
    env = run_env() if temp is None else run_env(TMPDIR=str(temp))
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, lines


def _preflight(cwd: Path, nproc: int, *train_args: str) -> tuple[int, list[str]]:
    """The same command line through the launcher's preflight in this process (what
    ``odin-ns-train`` runs before torchrun), without importing nerfstudio again: every
    check below stops there; test_missing_data_path_fails_before_any_rank runs the script."""
    argv = ["--nproc-per-node", str(nproc), "odin-splatfacto", *train_args]
    return launch_in_process([*argv, "--vis", "tensorboard"], cwd)


def _tiny_scene(path: Path, views: int = 2) -> Path:
    from odin_ns.data.synthetic import make_scene

    return make_scene(
        path, layout="object", num_views=views, num_eval_views=1, seed=1, width=32, height=24
    )


def _assert_preflight_error(cwd: Path, code: int, lines: list[str], reason: str) -> None:
    output = "\n".join(lines[-40:])
    assert code == 1, output
    assert lines[-1].startswith(PREFIX + reason), output
    assert sum(line.startswith(PREFIX) for line in lines) == 1, output
    assert "FAILED" not in output, "torchrun started ranks"
    assert not (cwd / "outputs").exists(), "an output folder was created"


def test_missing_data_path_fails_before_any_rank(tmp_path):
    code, lines = _launch(tmp_path, 2, "--data", str(tmp_path / "nonexistent"))
    _assert_preflight_error(tmp_path, code, lines, f"data path '{tmp_path / 'nonexistent'}'")
    assert lines[-1].endswith("does not exist (pass --data DIR)")


def test_more_ranks_than_views_fails_before_any_rank(tmp_path):
    scene = _tiny_scene(tmp_path / "tiny", views=2)
    code, lines = _preflight(tmp_path, 3, "--data", str(scene))
    _assert_preflight_error(tmp_path, code, lines, "3 ranks but only 2 training views")


def test_nccl_transport_on_cpu_ranks_fails_before_any_rank(tmp_path):
    scene = _tiny_scene(tmp_path / "tiny", views=2)
    args = ("--data", str(scene), "--machine.device-type", "cpu")
    code, lines = _preflight(tmp_path, 2, *args, "--pipeline.sync.transport", "nccl")
    _assert_preflight_error(tmp_path, code, lines, "--pipeline.sync.transport nccl moves")


def test_scene_without_images_fails_before_any_rank(tmp_path):
    scene = tmp_path / "empty"
    scene.mkdir()
    (scene / "transforms.json").write_text(
        json.dumps({"fl_x": 50, "fl_y": 50, "cx": 16, "cy": 16, "w": 32, "h": 32, "frames": []})
    )
    code, lines = _preflight(tmp_path, 2, "--data", str(scene))
    _assert_preflight_error(tmp_path, code, lines, f"could not read a scene from '{scene}'")


def test_scene_with_a_missing_image_fails_before_any_rank(tmp_path):
    scene = _tiny_scene(tmp_path / "tiny", views=2)
    shutil.rmtree(scene / "images")
    code, lines = _preflight(tmp_path, 2, "--data", str(scene))
    _assert_preflight_error(tmp_path, code, lines, f"could not read a scene from '{scene}'")
    assert "frame_00000.png" in lines[-1]


def test_unknown_training_option_is_a_usage_error(tmp_path):
    code, lines = _preflight(tmp_path, 2, "--no-such-option", "1")
    assert code == 2, "\n".join(lines[-20:])
    assert lines[-1].startswith(PREFIX + "invalid training arguments")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_rank_failing_after_spawn_prints_its_reason_last(tmp_path, start_method):
    """A readable archive that is not a checkpoint passes the launcher's archive check and
    fails in the ranks (truncated or corrupt files fail in preflight: test_reliability):
    the reason follows torchrun's report. Both ways ranks start: forked (CPU ranks, every
    other run of the suite) and spawned (``python -u -m``, as GPU ranks start)."""
    import torch

    scene = _tiny_scene(tmp_path / "tiny", views=2)
    ckpt = tmp_path / "step-000000010.ckpt"
    torch.save({"this is": "not a checkpoint"}, ckpt)
    temp = tmp_path / "temp"
    temp.mkdir()
    code, lines = _launch(
        tmp_path, 2, "--data", str(scene), "--load-checkpoint", str(ckpt),
        start_method=start_method, temp=temp,
    )  # fmt: skip
    # the launcher's folders (its failure file, torchrun's error files) are gone with it
    left = [p.name for p in temp.iterdir() if p.name.startswith(("torchelastic_", "odin-ns-"))]
    assert not left, left
    output = "\n".join(lines[-60:])
    assert code == 1, output
    assert "odin_ns.launch FAILED" in output, "torchrun's report is missing"
    assert lines[-1].startswith(PREFIX + "rank "), output
    assert f"cannot resume from checkpoint '{ckpt}'" in lines[-1], output
    assert "Traceback" not in output and "ChildFailedError" not in output, output
    assert sum(line.startswith(PREFIX) for line in lines) == 1, output


FORK_AFTER_PREFLIGHT = """
import os, sys, torch
from odin_ns import launch

args, rest = launch._split_launcher_args(sys.argv[1:])
assert launch.prepare_ranks(args, rest) == ("fork", {})
pid = os.fork()
if pid == 0:  # a rank: OpenMP work on two threads
    torch.set_num_threads(2)
    torch.randn(4_000_000).exp().sum()
    os._exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_rank_forked_after_the_preflight_can_use_openmp_threads(tmp_path):
    """CPU ranks are forked from the launcher, and GNU OpenMP's thread pool does not survive
    a fork: a child of a process whose pool started waits forever in its first parallel
    region. After the launcher's own work (config, preflight, dataparser), a forked child
    must run two-thread OpenMP work; this hangs (killed at the deadline) if the launcher
    starts its pool. OMP_NUM_THREADS is unset, as for most users."""
    import os
    import signal
    import sys

    scene = _tiny_scene(tmp_path / "tiny", views=2)
    argv = ["--nproc-per-node", "2", "odin-splatfacto", "--data", str(scene)]
    env = run_env(threads=None)
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", FORK_AFTER_PREFLIGHT, *argv],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail("a rank forked after the launcher's preflight hung in OpenMP\n" + output)
    assert proc.returncode == 0, output[-3000:]


# ------------------------------------------------------------------ the failure file


def _child_failed(exitcodes: dict[int, int]):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failures = {
        rank: ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code, error_file="<N/A>")
        for rank, code in exitcodes.items()
    }
    return ChildFailedError("odin_ns.launch", failures)


def test_the_earliest_written_reason_is_chosen(tmp_path):
    path = tmp_path / "failures.tsv"
    launch.record_failure(path, "rank 1: peer 0 (step 7): no publication for 60 s")
    launch.record_failure(path, "rank 0: later\nsecond line")
    written = launch.read_failures(path)
    assert [reason for _, reason in written] == [
        "rank 1: peer 0 (step 7): no publication for 60 s",
        "rank 0: later second line",
    ]
    reason = launch._failure_reason(written, _child_failed({1: 1}))
    assert reason == "rank 1: peer 0 (step 7): no publication for 60 s"


def test_a_silent_rank_killed_by_a_signal_is_named():
    from signal import SIGKILL, SIGTERM

    assert launch._failure_reason([], _child_failed({1: -SIGKILL})) == (
        "rank 1 was killed by SIGKILL" + launch.OOM_HINT
    )
    assert "out-of-memory" in launch.OOM_HINT
    assert launch._failure_reason([], _child_failed({1: -SIGTERM})) == (
        "rank 1 was killed by SIGTERM"
    )
    assert launch._failure_reason([], _child_failed({0: 3})) == "rank 0 exited with code 3"


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        (
            FloatingPointError("rank 1: non-finite loss at step 3"),
            "rank 1: non-finite loss at step 3",
        ),
        (RuntimeError("boom\ndetails"), "rank 1: RuntimeError: boom"),
    ],
)
def test_rank_reasons_are_one_rank_prefixed_line(err, expected):
    from odin_ns.errors import OdinInputError, rank_reason

    with_type = not isinstance(err, FloatingPointError)
    assert rank_reason(1, err, with_type=with_type) == expected
    assert rank_reason(1, OdinInputError("bad")) == "rank 1: bad"


def test_set_up_objects_are_left_out_of_later_collections():
    """``keep_setup_out_of_collections`` (the end of ``OdinTrainer.setup``) freezes what is
    alive: a full collection during training no longer walks it (0.4 s per rank on the CPU
    machine), while objects made afterwards are still collected."""
    import gc
    import weakref

    from odin_ns.trainer import keep_setup_out_of_collections

    class Node:
        pass

    made_in_setup = [object()]
    garbage = Node()
    garbage.self = garbage  # a cycle, unreachable after del: collected, not frozen
    dead = weakref.ref(garbage)
    del garbage
    keep_setup_out_of_collections()
    try:
        assert gc.get_freeze_count() > 0
        assert not any(o is made_in_setup for o in gc.get_objects())  # frozen
        assert dead() is None
        made_in_training = [object()]
        assert any(o is made_in_training for o in gc.get_objects())  # still collected
    finally:
        gc.unfreeze()


def test_a_failed_rank_with_live_groups_ends_at_once_else_returns(monkeypatch, capsys):
    """A failed rank whose process groups are still alive (``_train_rank`` leaves them so
    where publications may travel over NCCL) ends at once (``os._exit``) after its
    traceback: destroying them would wait for sends no peer will receive. A rank whose
    groups were destroyed (gloo runs) returns, to unwind as before."""
    import torch.distributed as dist

    exits: list[int] = []

    class Ended(Exception):
        pass

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise Ended

    monkeypatch.setattr(launch.os, "_exit", fake_exit)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    launch._end_nccl_rank(RuntimeError("x"))
    assert exits == []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    try:
        raise RuntimeError("peer 1 stopped taking")
    except RuntimeError as err:
        with pytest.raises(Ended):
            launch._end_nccl_rank(err)
    assert exits == [1]
    assert "RuntimeError: peer 1 stopped taking" in capsys.readouterr().err


def test_cuda_ranks_that_may_use_nccl_load_kernels_eagerly(monkeypatch):
    """Ranks whose publications may travel over NCCL have CUDA load kernels eagerly (a lazy
    load can wait for a send spinning on the GPU), set in their environment by the launcher
    before they start (a rank's imports start CUDA); a user's own setting stands."""
    assert launch.may_use_nccl(launch.parse_training_config(["odin-splatfacto"]))
    forced = ["odin-splatfacto", "--pipeline.sync.transport", "gloo"]
    assert not launch.may_use_nccl(launch.parse_training_config(forced))
    assert not launch.may_use_nccl(launch.parse_training_config(["splatfacto"]))
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    on_gpus = ["odin-splatfacto", "--machine.device-type", "cuda"]
    config = launch.parse_training_config(on_gpus)
    assert launch.rank_environment(config, 2) == {"CUDA_MODULE_LOADING": "EAGER"}
    assert launch.rank_environment(config, 1) == {}  # one rank: no peer to wait for
    gloo = launch.parse_training_config([*on_gpus, *forced[1:]])
    assert launch.rank_environment(gloo, 2) == {}  # publications forced to gloo
    cpu = launch.parse_training_config(["odin-splatfacto", "--machine.device-type", "cpu"])
    assert launch.rank_environment(cpu, 2) == {}
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    assert launch.rank_environment(config, 2) == {}
