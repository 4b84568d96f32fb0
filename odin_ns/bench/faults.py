"""Fault matrix: every way a 2-rank CPU run can break, and how it ends.

    python -m odin_ns.bench.faults --out bench/faults.json

Each case runs ``odin-ns-train`` (2 ranks, gloo, the built-in street scene) through
``odin_ns.bench.fault_worker``, which injects the fault from outside the production code.
A row: exit code, seconds from the fault (or the launch, for input faults) to the
launcher's exit, the last line printed, how many of the run's processes survived it, whether
the last good checkpoint still loads (weights-only, finite; None where no checkpoint is
involved), and ``ok``: non-zero exit within ``timeout_s`` + 30 s with the expected reason in
the last line, no survivor, no good checkpoint lost.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from odin_ns.bench.commands import (
    module_launcher,
    quiet_flags,
    run_env,
    schedule_flags,
    train_command,
)

TIMEOUT_S = 8.0  # --pipeline.sync.timeout-s of every case
STEPS = 30
TRAINING = [
    *quiet_flags(save_every=4, keep_checkpoints=True),
    *schedule_flags(warmup=5, refine_every=8),
    *("--pipeline.sync.timeout-s", str(TIMEOUT_S)),
]
PREFIX = "odin-ns-train: error: "
RUN_MARK = "ODIN_NS_FAULT_RUN"


@dataclass
class Case:
    """One fault: how to run it and the reason its last line must give."""

    name: str
    reason: str  # regex the last line must match after the prefix
    fault: dict = field(default_factory=dict)
    nproc: int = 2
    extra: list[str] = field(default_factory=list)
    data: str = "street"  # "street" or "missing_image"
    good_checkpoint: str | None = "own"  # "own": those the run wrote; "base"; None
    output: str = "tmp"  # "tmp" or "readonly"


@dataclass
class Row:
    name: str
    exit_code: int | None
    seconds: float
    last_line: str
    survivors: int
    checkpoint_loads: bool | None
    ok: bool
    wall_s: float
    expected: str


def _cases(base_ckpt: Path, work: Path) -> list[Case]:
    corrupt, truncated = work / "corrupt.ckpt", work / "truncated.ckpt"
    data = base_ckpt.read_bytes()
    mangled = bytearray(data)
    mangled[:4096] = os.urandom(4096)
    corrupt.write_bytes(bytes(mangled))
    truncated.write_bytes(data[: len(data) // 2])
    killed = r"rank 1 was killed by SIGKILL"
    return [
        Case("rank killed mid-step", killed, {"kind": "kill_step", "rank": 1, "step": 7}),
        Case("rank killed mid-drain", killed, {"kind": "kill_drain", "rank": 1, "step": 5}),
        Case(
            "rank killed mid-structural-change",
            killed,
            {"kind": "kill_structural", "rank": 1, "step": 5},
        ),
        Case(
            "rank 0 killed mid-checkpoint-write",
            r"rank 0 was killed by SIGKILL",
            {"kind": "kill_checkpoint", "write": 2},
        ),
        Case(
            "stalled peer",
            rf"rank 0: peer 1 \(step \d+\): timed out after {TIMEOUT_S} s",
            {"kind": "stall", "rank": 1, "step": 7, "seconds": 600},
        ),
        Case(
            "corrupt checkpoint",
            rf"(rank \d: )?cannot resume from checkpoint '{re.escape(str(corrupt))}'",
            extra=["--load-checkpoint", str(corrupt)],
            good_checkpoint="base",
        ),
        Case(
            "truncated checkpoint",
            rf"(rank \d: )?cannot resume from checkpoint '{re.escape(str(truncated))}'",
            extra=["--load-checkpoint", str(truncated)],
            good_checkpoint="base",
        ),
        Case(
            "NaN gradient",
            r"rank 1: non-finite gradient of 'means' at step 7",
            {"kind": "nan_grad", "rank": 1, "step": 7},
        ),
        Case(
            "resume with a wrong world size",
            r"17 ranks but only \d+ training views",
            nproc=17,
            extra=["--load-checkpoint", str(base_ckpt)],
            good_checkpoint="base",
        ),
        Case(
            "missing image",
            r"could not read a scene from .*frame_00003\.png",
            data="missing_image",
            good_checkpoint=None,
        ),
        Case(
            "read-only output folder",
            r"(read-only|Read-only|Permission denied|not writable)",
            output="readonly",
            good_checkpoint=None,
        ),
    ]


def _cases_names() -> list[Case]:
    """The cases in order (names only matter)."""
    tmp = Path(tempfile.mkdtemp(prefix="odin-faults-names-"))
    try:
        (tmp / "x.ckpt").write_bytes(b"0" * 8192)
        return _cases(tmp / "x.ckpt", tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _launch(
    data: Path, out: Path, nproc: int, extra: list[str], fault: dict, report: Path, mark: str
) -> tuple[int | None, list[str], float]:
    cmd = train_command(
        data,
        out,
        ranks=nproc,
        experiment="faults",
        name="run",
        steps=STEPS,
        flags=[*TRAINING, *extra],
        launcher=module_launcher("odin_ns.bench.fault_worker"),
    )
    env = run_env()
    env.update({"ODIN_NS_FAULT": json.dumps(fault), "ODIN_NS_FAULT_REPORT": str(report)})
    env[RUN_MARK] = mark
    start = time.time()
    try:
        proc = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=240
        )
        code, text = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as err:  # a hang: the row says so
        code = None
        text = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
    lines = [line for line in text.splitlines() if line.strip()]
    return code, lines, start


def _survivors(mark: str) -> int:
    import psutil

    time.sleep(1.0)
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(RUN_MARK) == mark:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    for proc in found:  # leave nothing behind
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return len(found)


def checkpoint_loads(path: Path | None) -> bool:
    """The checkpoint loads weights-only (as ns-eval does) and its Gaussians are finite."""
    import torch

    if path is None or not path.is_file():
        return False
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return False
    gauss = [v for k, v in state["pipeline"].items() if "gauss_params" in k]
    return bool(gauss) and all(bool(torch.isfinite(v).all()) for v in gauss)


def _readonly_dir(path: Path) -> Path:
    """A folder this process cannot write to (root ignores permissions: a read-only tmpfs)."""
    path.mkdir(parents=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        return path
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], check=True)
    return path


def _release_readonly(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["umount", str(path)], check=False)
    else:
        path.chmod(0o755)


def run_case(case: Case, work: Path, scenes: dict[str, Path], base_ckpt: Path) -> Row:
    folder = work / re.sub(r"[^a-z0-9]+", "-", case.name.lower())
    report = folder / "report"
    report.mkdir(parents=True)
    out = folder / "out"
    if case.output == "readonly":
        out = _readonly_dir(folder / "readonly")
    mark = uuid.uuid4().hex
    try:
        code, lines, start = _launch(
            scenes[case.data], out, case.nproc, case.extra, case.fault, report, mark
        )
    finally:
        if case.output == "readonly":
            _release_readonly(out)
    ended = time.time()
    stamp = report / "fault.time"
    struck = float(stamp.read_text()) if stamp.is_file() else start
    survivors = _survivors(mark)
    last = lines[-1] if lines else ""
    loads: bool | None = None
    if case.good_checkpoint == "base":
        loads = checkpoint_loads(base_ckpt)
    elif case.good_checkpoint == "own":
        ckpts = sorted(
            (out / "faults" / "odin-splatfacto" / "run" / "nerfstudio_models").glob("step-*.ckpt")
        )
        loads = bool(ckpts) and all(checkpoint_loads(p) for p in ckpts)
    seconds = ended - struck
    ok = (
        code not in (0, None)
        and seconds <= TIMEOUT_S + 30
        and last.startswith(PREFIX)
        and re.search(case.reason, last) is not None
        and survivors == 0
        and loads is not False
    )
    return Row(
        case.name, code, round(seconds, 2), last, survivors, loads, ok, round(ended - start, 2),
        case.reason,
    )  # fmt: skip


def _base_checkpoint(scene: Path, work: Path) -> Path:
    """A good 2-rank checkpoint for the checkpoint cases."""
    out = work / "base"
    code, lines, _ = _launch(
        scene, out, 2, ["--max-num-iterations", "11"], {}, work / "base-report", uuid.uuid4().hex
    )
    ckpts = sorted(
        (out / "faults" / "odin-splatfacto" / "run" / "nerfstudio_models").glob("step-*.ckpt")
    )
    if code != 0 or not ckpts:
        raise RuntimeError("the base run failed:\n" + "\n".join(lines[-20:]))
    return ckpts[-1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/faults.json"))
    parser.add_argument("--only", default=None, help="run the cases whose name contains this")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--merge", action="store_true", help="with --only: keep --out's other rows")
    args = parser.parse_args(argv)

    from odin_ns.data.synthetic import make_scene

    work = Path(tempfile.mkdtemp(prefix="odin-faults-"))
    started = time.time()
    try:
        street = make_scene(
            work / "street", layout="street", num_views=16, num_eval_views=3, seed=0
        )
        missing = work / "missing_image"
        shutil.copytree(street, missing)
        (missing / "images" / "frame_00003.png").unlink()  # a held-out (evaluation) view
        scenes = {"street": street, "missing_image": missing}
        base = _base_checkpoint(street, work)
        rows = []
        for case in _cases(base, work):
            if args.only and args.only not in case.name:
                continue
            row = run_case(case, work, scenes, base)
            rows.append(row)
            flag = "ok " if row.ok else "BAD"
            print(
                f"{flag} {row.name:36s} exit {row.exit_code} {row.seconds:6.1f} s  {row.last_line}"
            )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.merge and args.out.is_file():
        fresh = {r.name for r in rows}
        old = [
            Row(**c) for c in json.loads(args.out.read_text())["cases"] if c["name"] not in fresh
        ]
        order = [c.name for c in _cases_names()]
        rows = sorted([*rows, *old], key=lambda r: order.index(r.name) if r.name in order else 99)
    result = {
        "timeout_s": TIMEOUT_S,
        "limit_s": TIMEOUT_S + 30,
        "world_size": 2,
        "wall_s": round(time.time() - started, 1),
        "cases": [asdict(r) for r in rows],
        "all_ok": all(r.ok for r in rows),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"all_ok: {result['all_ok']}  ({len(rows)} cases, {result['wall_s']} s) -> {args.out}")


if __name__ == "__main__":
    main()
