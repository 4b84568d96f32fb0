"""Two CPU ranks (gloo) through the real entry point: quality-first == barrier, exactly.

Both runs use the same scene, seed, plan and world size and cross a densification step;
quality-first must end with the same parameters as barrier-synchronous training, equal
version vectors on both ranks, and no visibility violation. The checkpoint of a 2-rank run
must evaluate in single-process ns-eval.

The runs are the session's shared 2-rank family (tests/harness/street_runs.py: 40 steps,
refines at 24 and 32, a checkpoint at 28), which the sharded tests compare too.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from harness.runs import TrainJob, launch_in_process, train_side_by_side
from harness.street_runs import EVAL, QUALITY_FIRST, STEPS, TRAINING

from odin_ns.bench.commands import BIN, free_port, run_dir, run_env, train_command


def _final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = sorted((run_dir / "nerfstudio_models").glob("step-*.ckpt"))[-1]
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["pipeline"]
    return {k: v for k, v in state.items() if "gauss_params" in k}


@pytest.mark.slow
def test_quality_first_equals_barrier(street_runs_2):
    barrier = _final_params(street_runs_2["barrier"])
    quality = _final_params(street_runs_2["quality-first"])
    assert barrier.keys() == quality.keys()
    for key in barrier:
        assert torch.equal(quality[key], barrier[key]), key  # bitwise

    summary = json.loads((street_runs_2["quality-first"] / "odin_run.json").read_text())
    ranks = summary["ranks"]
    assert ranks[0]["replica_hash"] == ranks[1]["replica_hash"]
    # the run crossed at least one densification (the Gaussian count changed between phases)
    counts = {p["num_gaussians"] for p in ranks[0]["phases"]}
    assert len(counts) > 1, counts


def _node_command(data, out, node: int, port: int, steps: int, flags) -> list[str]:
    """``odin-ns-train`` as node ``node`` of 2 (one rank each) with its master here, on
    core ``node`` only (``taskset``): a node of one core, whose rank then trains on one
    thread as each rank of a 2-rank run on this machine does."""
    nodes = ["--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1"]
    cmd = train_command(
        data, out, ranks=1, experiment="nodes", name="run", steps=steps, flags=flags,
        port=port, launcher_flags=nodes,
    )  # fmt: skip
    return ["taskset", "-c", str(node), *cmd]


@pytest.mark.slow
def test_two_nodes_quality_first_equals_barrier(street_runs_2, street_scene, fork_server, tmp_path):
    """The README's multi-node command, as two launchers on this machine (``--nnodes 2``,
    one rank each, master 127.0.0.1): quality-first ends bit for bit at the 2-rank family's
    barrier run."""
    port, flags = free_port(), [*TRAINING, *QUALITY_FIRST, *EVAL]
    jobs = [
        TrainJob(f"node{k}", _node_command(street_scene, tmp_path, k, port, STEPS, flags),
                 run_dir(tmp_path, "nodes", "run"))
        for k in (0, 1)
    ]  # fmt: skip
    results = train_side_by_side(jobs, tmp_path / "logs", server=fork_server)  # both at once
    results["node1"].check()
    ours = _final_params(results["node0"].check())
    theirs = _final_params(street_runs_2["barrier"])
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    summary = json.loads((results["node0"].run_dir / "odin_run.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]


@pytest.mark.slow
def test_resume_on_the_same_world_size_is_exact(street_runs_2, street_resumed):
    """Checkpoint at step 28 of 40 (between the refines at 24 and 32), resume on 2 ranks: the
    final parameters equal the uninterrupted run's bit for bit."""
    ours = _final_params(street_resumed["quality-first"].check())
    theirs = _final_params(street_runs_2["quality-first"])
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["quality-first", "throughput-first"])
def test_live_panel_snapshot_equals_saved_run(street_runs_2, mode):
    """The live panels (recent window, peers via phase-start exchanges) and ns-viewer's
    saved-run panels derive wait hidden and staleness with one formula: same numbers."""
    from odin_ns.viewer_ext.snapshot import snapshot_from_run, wait_hidden

    run = json.loads((street_runs_2[mode] / "odin_run.json").read_text())
    live, saved = run["live_snapshot"], snapshot_from_run(run)
    assert wait_hidden(saved) is not None
    assert wait_hidden(live) == wait_hidden(saved)
    for key in ("barrier_wait_estimate_s", "odin_wait_s"):
        assert live[key] == saved[key], key
    for key in ("staleness_hist", "admitted", "fallbacks"):
        assert live.get(key) == saved.get(key), key
    assert [len(r["steps"]) for r in live["ranks"]] == [STEPS, STEPS]


@pytest.mark.slow
def test_two_rank_checkpoint_evaluates_in_single_process(street_runs_2, tmp_path):
    run = street_runs_2["quality-first"]
    out = tmp_path / "eval.json"
    proc = subprocess.run(
        [str(BIN / "ns-eval"), "--load-config", str(run / "config.yml"), "--output-path", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert results["psnr"] > 10.0


def test_more_ranks_than_views_is_a_clear_error(tmp_path):
    from odin_ns.data.synthetic import make_scene

    scene = make_scene(tmp_path / "tiny", layout="object", num_views=2, num_eval_views=1, seed=1)
    argv = ["--nproc-per-node", "3", "odin-splatfacto", "--data", str(scene)]
    code, lines = launch_in_process([*argv, "--vis", "tensorboard"], tmp_path)
    assert code != 0
    assert "3 ranks but only 2 training views" in "\n".join(lines)


@pytest.mark.slow
def test_ns_viewer_shows_the_runs_sync_panels(street_runs_2, tmp_path):
    """`ns-viewer --load-config` on a finished 2-rank run shows the Odin panels (real browser)."""
    import socket
    import time

    from odin_ns.bench.headless import HeadlessChromium, find_chromium

    if find_chromium() is None:
        pytest.skip("Debian's chromium is not installed (make test installs it)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = street_runs_2["quality-first"]
    viewer = subprocess.Popen(
        [
            str(BIN / "ns-viewer"),
            "--load-config",
            str(run / "config.yml"),
            "--viewer.websocket-port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert viewer.poll() is None, "ns-viewer exited"
            time.sleep(1.0)
        with HeadlessChromium(f"http://127.0.0.1:{port}") as page:
            # The viser page draws the scene in software WebGL on this CPU machine: on 2
            # busy cores its first render takes minutes, so the wait is generous.
            page.wait_for(
                "document.body.innerText.includes('Wait hidden vs a barrier')", timeout_s=300
            )
            text = page.text()
            assert "quality-first" in text
            assert "ranks" in text and "2" in text
            page.screenshot(tmp_path / "ns_viewer_panels.png")
            if os.environ.get("ODIN_UPDATE_SCREENSHOT") == "1":
                page.screenshot(Path(__file__).parents[1] / "docs" / "viewer_panels_run.png")
    finally:
        os.killpg(viewer.pid, 15)
        viewer.wait(timeout=30)


def rank_processes(launcher_pid: int) -> dict:
    """rank -> psutil.Process of the launcher's ranks, found by the name each rank gives
    itself (``odin-ns-rank<R>``): forked ranks share the launcher's command line."""
    import psutil

    from odin_ns.launch import RANK_PROCESS_NAME

    ranks = {}
    for proc in psutil.Process(launcher_pid).children(recursive=True):
        try:
            name = proc.name()
        except psutil.NoSuchProcess:
            continue
        if name.startswith(RANK_PROCESS_NAME):
            ranks[int(name.removeprefix(RANK_PROCESS_NAME))] = proc
    return ranks


@pytest.mark.slow
def test_a_killed_node_ends_the_other(street_scene, tmp_path):
    """Two launchers as two nodes; SIGKILL node 1 (its launcher and rank) mid-run, wherever
    it is (ordinary steps, a phase start's drain or rendezvous, a checkpoint): node 0's
    launcher ends non-zero with the reason last, well within the sync timeout, and its rank
    is gone (a dead peer ends every rank, never a hang). In a step or a drain node 0's rank
    reads the closed connection; in a rendezvous nothing reads it, and node 1's pulses,
    stopped for ten periods (5 s here), end the wait (``liveness.PeerSilence``)."""
    import signal
    import time

    import psutil

    port = free_port()
    flags = [*TRAINING, "--pipeline.sync.timeout-s", "60", "--pipeline.sync.heartbeat-s", "0.5"]
    nodes = [
        subprocess.Popen(
            _node_command(street_scene, tmp_path, k, port, 100000, flags),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=run_env(TMPDIR=str(tmp_path)),  # the killed launcher's temp folder stays here
            start_new_session=True,
        )
        for k in (0, 1)
    ]  # fmt: skip
    try:
        deadline = time.time() + 300
        while not list(tmp_path.rglob("config.yml")) and time.time() < deadline:
            time.sleep(1.0)  # rank 0 writes it once both ranks joined the process group
            assert all(node.poll() is None for node in nodes), nodes[0].stdout.read()[-3000:]
        time.sleep(4.0)  # a few training steps
        rank0 = rank_processes(nodes[0].pid)[0]
        killed_at = time.time()
        os.killpg(nodes[1].pid, signal.SIGKILL)
        output, _ = nodes[0].communicate(timeout=120)
        print(output[-2500:])
        assert nodes[0].returncode != 0
        assert time.time() - killed_at < 30, "node 0 did not end well within the sync timeout"
        last = output.strip().splitlines()[-1].lower()
        assert "rank 0" in last and ("peer" in last or "failed" in last), last
        _, alive = psutil.wait_procs([rank0], timeout=10)
        assert not alive, "rank 0 survived its peer's death"
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
