"""A fork server for the suite's ``odin-ns-train`` runs: one interpreter pays the launcher's
imports once (nerfstudio's method configs, torch, gsplat: about 10 CPU-seconds a process
here, against about 4 s for the 40 training steps of a 2-rank street run), then forks one
child per run, which runs the command as its script would: ``odin_ns.launch.main`` for
``odin-ns-train``, nerfstudio's ``entrypoint`` for ``ns-train``, ``python -m module`` for a
wrapper launcher (``odin_ns.bench.jitter``).

It is the launcher's own pattern one level up: the launcher forks its CPU ranks from an
interpreter that has imported nerfstudio (``odin_ns.launch.ForkedRank``). The server never
computes with torch (GNU OpenMP's thread pool does not survive a fork) and has no thread of
its own (a fork copies only the forking thread, and a lock another thread held would stay
held in the child).

Every child gets its own session (``killpg`` ends the run and its ranks), working
directory, environment, torch threads (``OMP_NUM_THREADS`` of its environment, else torch's
default: what a fresh interpreter would take) and log file on stdout and stderr. Tests that
check how the scripts themselves start (``tests/test_launch.py``, the PSNR run of
``tests/test_train_e2e.py``) run the real scripts, never this.

Protocol, one JSON object per line: the client (:class:`ForkServer`) writes
``{"id", "argv", "module", "function", "env", "cwd", "log"}``; the server answers
``{"id", "pid"}`` at once and ``{"id", "code"}`` (``Popen.returncode``'s convention:
minus the signal) when the run ends.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

# What an odin-ns-train launcher and its forked ranks import: paid once here.
PRELOAD = (
    "odin_ns.launch",
    "odin_ns.trainer",
    "odin_ns.pipeline",
    "odin_ns.bench.jitter",
    "odin_ns.bench.fault_worker",
    "nerfstudio.scripts.train",
    "torch.distributed.run",
    "torch.distributed.launcher.api",
)
# console scripts this server runs: name -> (module, function)
SCRIPTS = {
    "odin-ns-train": ("odin_ns.launch", "main"),  # pyproject.toml's [project.scripts]
    "ns-train": ("nerfstudio.scripts.train", "entrypoint"),  # nerfstudio's
}


# ------------------------------------------------------------------------ the server


def _run_child(request: dict, channels: tuple[int, int], default_threads: int) -> int:
    """In the forked child: become the run's process, run its entry point, return its code."""
    import runpy

    import torch

    os.setsid()
    for fd in channels:
        os.close(fd)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", default_threads)))
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=True)
    sys.argv = list(request["argv"])
    try:
        if request["function"]:
            module = __import__(request["module"], fromlist=[request["function"]])
            getattr(module, request["function"])()
        else:
            with warnings.catch_warnings():  # preloaded here, as in a forked rank
                warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
                runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code
        if code is None:
            return 0
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            return 1
        return code
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def serve() -> None:
    """Preload, then fork a child per request read on stdin until stdin closes; a run still
    going then is killed (its client, the test session, was killed), then reaped."""
    import importlib

    import torch

    default_threads = torch.get_num_threads()  # a fresh interpreter's, in this environment
    torch.set_num_threads(1)  # no OpenMP pool in the parent of forks
    from odin_ns.method_registry import method_registry

    method_registry()
    for name in PRELOAD:
        importlib.import_module(name)
    # The protocol keeps private copies of stdin / stdout; fds 0-2 of every child are its own.
    requests, replies = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    running: dict[int, int] = {}  # pid -> request id
    pending = b""
    open_ = True

    def reply(message: dict) -> None:
        with contextlib.suppress(BrokenPipeError):  # the client is gone: nobody to tell
            os.write(replies, (json.dumps(message) + "\n").encode())

    while open_ or running:
        if open_ and select.select([requests], [], [], 0.05)[0]:
            chunk = os.read(requests, 1 << 16)
            open_ = bool(chunk)
            if not open_:  # the client is gone (it closes only after its runs have ended)
                for pid in running:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)  # the run's session: it and its ranks
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        code = _run_child(request, (requests, replies), default_threads)
                    finally:
                        sys.stdout.flush()
                        sys.stderr.flush()
                        os._exit(code if 0 <= code < 256 else 1)
                running[pid] = request["id"]
                reply({"id": request["id"], "pid": pid})
        elif not open_:
            time.sleep(0.05)
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            reply({"id": running.pop(pid), "code": os.waitstatus_to_exitcode(status)})


# ------------------------------------------------------------------------ the client


class ForkServer:
    """The test process's handle on one server (``python -m harness.fork_server``).

    ``serves(cmd)``: whether a command is one it runs (``odin-ns-train ...`` or
    ``python -m odin_ns.... ...``); ``run(cmd, env, cwd, log, timeout_s)`` runs it and
    returns its exit code, or None past ``timeout_s`` (the run's session is killed).
    """

    def __init__(self, env: dict[str, str]):
        tests = str(Path(__file__).resolve().parents[1])
        paths = [tests, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "harness.fork_server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**env, "PYTHONPATH": os.pathsep.join(paths)},
        )
        self._lock = threading.Condition()
        self._pids: dict[int, int] = {}
        self._codes: dict[int, int] = {}
        self._next = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            message = json.loads(line)
            with self._lock:
                table = self._codes if "code" in message else self._pids
                table[message["id"]] = message.get("code", message.get("pid"))
                self._lock.notify_all()
        with self._lock:
            self._lock.notify_all()

    @staticmethod
    def _entry(cmd: list[str]) -> tuple[str, str | None, list[str]] | None:
        """(module, function or None, argv) of a command this server runs, else None."""
        name = Path(cmd[0]).name
        if name in SCRIPTS:
            module, function = SCRIPTS[name]
            return module, function, [name, *cmd[1:]]
        if len(cmd) > 2 and cmd[0] == sys.executable and cmd[1] == "-m":
            if cmd[2].startswith("odin_ns."):
                return cmd[2], None, [cmd[2], *cmd[3:]]
        return None

    def serves(self, cmd: list[str]) -> bool:
        return self._entry(list(cmd)) is not None and self._proc.poll() is None

    def _wait_for(self, table: dict[int, int], key: int, deadline: float) -> int | None:
        with self._lock:
            while key not in table:
                left = deadline - time.monotonic()
                if left <= 0 or self._proc.poll() is not None:
                    return table.get(key)
                self._lock.wait(min(left, 1.0))
            return table.pop(key)

    def run(
        self, cmd: list[str], env: dict[str, str], cwd: Path, log: Path, timeout_s: float
    ) -> int | None:
        entry = self._entry(list(cmd))
        assert entry is not None, cmd
        module, function, argv = entry
        with self._lock:
            key = self._next
            self._next += 1
            request = dict(id=key, module=module, function=function, argv=argv, env=env)
            request.update(cwd=str(cwd), log=str(log))
            self._proc.stdin.write((json.dumps(request) + "\n").encode())
            self._proc.stdin.flush()
        # the fork comes once the server has preloaded; only a dead server leaves no pid
        pid = self._wait_for(self._pids, key, math.inf)
        if pid is None:
            raise RuntimeError("the fork server died; its output is on the test's stderr")
        code = self._wait_for(self._codes, key, time.monotonic() + timeout_s)
        if code is None:  # past the deadline: end the run and its ranks
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._wait_for(self._codes, key, time.monotonic() + 30)  # reaped by the server
        return code

    def close(self) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


if __name__ == "__main__":
    serve()
