"""Training runs for tests: several ``odin-ns-train`` runs side by side, and the launcher's
preflight in this process.

Most of a tiny test run's wall time is not training: its launcher imports nerfstudio
(its CPU ranks are forked from it), about 10 s of one core here, while the 40 training
steps of a 2-rank street run take about 4 s. Runs whose results never depend on timing
(every bitwise comparison: quality-first and barrier, sharded and replicated, resumed and
uninterrupted) therefore go side by side, two at a time on this 2-core machine, and start
forked from the ``fork_server`` fixture (``harness.fork_server``: one interpreter that paid
the launcher's imports once), so no run pays them again: a 2-rank family of eight runs took
79-89 s that way against 119-151 s as fresh processes (interleaved, this machine).

    jobs = [TrainJob("qf", cmd, out / "dist" / "odin-splatfacto" / "qf"), ...]
    results = train_side_by_side(jobs, work_dir=out, server=fork_server)  # name -> RunResult

Checks that only concern the launcher's preflight (bad input rejected with one line before
any rank starts) call :func:`launch_in_process`: what ``odin_ns.launch.main`` (the
``odin-ns-train`` script) runs before it starts torchrun, without paying nerfstudio's import
again; one test per entry
point still runs the real script (tests/test_launch.py, tests/test_train_e2e.py). Likewise
:func:`ns_eval_in_process` and :func:`ns_export_splat_in_process` run what ``ns-eval`` and
``ns-export gaussian-splat`` run, on checkpoints of multi-rank runs.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from harness.fork_server import ForkServer
from odin_ns.bench.commands import run_env

PARALLEL_RUNS = 2  # runs side by side: this machine (and CI's) has 2 cores


@dataclass(frozen=True)
class TrainJob:
    """One training command; ``run_dir`` is where nerfstudio writes it."""

    name: str
    cmd: Sequence[str]
    run_dir: Path
    env: dict[str, str] = field(default_factory=run_env)
    timeout_s: float = 600.0
    forkable: bool = True  # False: a fresh process even beside a fork server (a script's test)


@dataclass(frozen=True)
class RunResult:
    """A finished run: exit code, non-empty output lines (stdout and stderr in order)."""

    code: int
    lines: list[str]
    run_dir: Path
    seconds: float

    def check(self) -> Path:
        """The run folder, after asserting the run succeeded (its output tail if not)."""
        assert self.code == 0, "\n".join(self.lines[-40:])
        return self.run_dir


def _run_process(job: TrainJob, log: Path) -> int | None:
    """``job`` as a fresh process (its session killed past its deadline): its exit code,
    or None if it ran past ``job.timeout_s``."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            list(job.cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=job.env,
            start_new_session=True,  # the launcher and its ranks: one group to end
        )
        try:
            return proc.wait(timeout=job.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None


def _run(job: TrainJob, log: Path, server: ForkServer | None = None) -> RunResult:
    started = time.monotonic()
    if server is not None and job.forkable and server.serves(job.cmd):
        code = server.run(job.cmd, job.env, Path.cwd(), log, job.timeout_s)
    else:
        code = _run_process(job, log)
    if code is None:  # past its deadline: the run and its ranks were killed
        code = -signal.SIGKILL
        with open(log, "a") as out:
            out.write(f"\n[test harness] {job.name}: killed after {job.timeout_s:.0f} s\n")
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    return RunResult(code, lines, job.run_dir, time.monotonic() - started)


def train_side_by_side(
    jobs: Sequence[TrainJob],
    work_dir: Path,
    parallel: int = PARALLEL_RUNS,
    server: ForkServer | None = None,
) -> dict[str, RunResult]:
    """Run ``jobs`` at most ``parallel`` at a time; each one's output goes to
    ``work_dir/<name>.log``. Returns name -> result (failures are returned, not raised).
    ``server`` (the ``fork_server`` fixture): the ``odin-ns-train`` runs start forked from
    it, without paying the launcher's imports again; other commands run as processes."""
    names = [job.name for job in jobs]
    assert len(set(names)) == len(names), names
    work_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = {
            job.name: pool.submit(_run, job, work_dir / f"{job.name}.log", server) for job in jobs
        }
        return {name: future.result() for name, future in futures.items()}


def launch_in_process(argv: Sequence[str], cwd: Path) -> tuple[int, list[str]]:
    """``odin-ns-train ARGV`` run in this process from ``cwd`` for a check that stops in the
    launcher's preflight: its exit code and its non-empty output lines, stdout and stderr
    interleaved in the order they were written (as a terminal shows them).

    A run that gets past the preflight would start torchrun here: callers pass input the
    preflight refuses (the test fails with "no error" otherwise).
    """
    from odin_ns import launch

    stream = io.StringIO()
    previous = Path.cwd()
    code: int | str | None = 0
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
            launch._preflight(*launch._split_launcher_args(list(argv)))
    except SystemExit as exit_:
        code = exit_.code
    finally:
        os.chdir(previous)
    assert code not in (0, None), (
        "the launcher's preflight accepted this input:\n" + (stream.getvalue()[-3000:])
    )
    lines = [line for line in stream.getvalue().splitlines() if line.strip()]
    return (code if isinstance(code, int) else 1), lines


def preflight_last_line(argv: Sequence[str], out: Path) -> tuple[int, str]:
    """:func:`launch_in_process` of ``odin-ns-train ARGV --output-dir OUT``, run from OUT's
    parent: its exit code and last output line."""
    code, lines = launch_in_process([*argv, "--output-dir", str(out)], out.parent)
    return code, lines[-1] if lines else ""


def ns_eval_in_process(config: Path, output: Path) -> dict:
    """``ns-eval --load-config CONFIG --output-path OUTPUT`` in this process (nerfstudio's
    ``ComputePSNR.main``, what the script runs): the written results. The real script runs in
    tests/test_train_e2e.py and tests/test_distributed.py."""
    import json

    from odin_ns.method_registry import method_registry

    method_registry()  # before nerfstudio's script imports it: cheaply
    from nerfstudio.scripts.eval import ComputePSNR

    ComputePSNR(load_config=config, output_path=output).main()
    return json.loads(output.read_text())["results"]


def ns_export_splat_in_process(config: Path, output_dir: Path) -> None:
    """``ns-export gaussian-splat --load-config CONFIG --output-dir DIR`` in this process."""
    from nerfstudio.scripts.exporter import ExportGaussianSplat

    ExportGaussianSplat(load_config=config, output_dir=output_dir).main()


__all__ = [
    "PARALLEL_RUNS",
    "RunResult",
    "TrainJob",
    "launch_in_process",
    "ns_eval_in_process",
    "ns_export_splat_in_process",
    "preflight_last_line",
    "train_side_by_side",
]
