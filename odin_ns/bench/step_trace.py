"""Which files of the project one ordinary training step runs, in call order (a trace, not a
reading of the code).

    python -m odin_ns.bench.step_trace --out bench/step_trace.json -- <odin-ns-train arguments>

runs ``odin-ns-train`` with the given arguments (a distributed run: ``--nproc-per-node 2
odin-splatfacto --data ...``), whose ranks run this module: rank 0 traces the Python calls
of ``OdinTrainer.train_iteration`` (``sys.setprofile``, the step's own thread) for steps
``--first`` to ``--first + --steps - 1``, and keeps, per step, the project's files in the
order their code first ran, with the first function of each. A step that starts a phase or
makes a structural change (``_start_phase``, ``_apply_structural_change`` in its trace) is
not ordinary; the JSON holds every traced step and names the first ordinary one.
``docs/architecture.md`` lists that step's files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import odin_ns

TRACE_ENV = "ODIN_NS_STEP_TRACE"  # JSON: {"first": .., "steps": .., "out": ..}
ROOT = Path(odin_ns.__file__).resolve().parent.parent  # the checkout (odin_ns, viewer_ext)
NOT_ORDINARY = ("_start_phase", "_apply_structural_change")


def project_file(filename: str) -> str | None:
    """``filename`` relative to the checkout if it is the project's code, else None."""
    path = Path(filename).resolve()
    try:
        rel = path.relative_to(ROOT)
    except ValueError:
        return None
    parts = rel.parts
    return str(rel) if parts and parts[0] in ("odin_ns", "viewer_ext", "method_configs") else None


def trace_call(fn, *args, **kwargs) -> tuple[object, list[tuple[str, str]]]:
    """Run ``fn``; return its result and [(file, first function)] of the project's files in
    the order their code first ran."""
    seen: dict[str, str] = {}

    def profile(frame, event, arg):
        if event != "call":
            return
        rel = project_file(frame.f_code.co_filename)
        if rel is not None and rel not in seen:
            seen[rel] = frame.f_code.co_name
        if rel is not None and frame.f_code.co_name in NOT_ORDINARY:
            seen.setdefault("(not ordinary)", frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return result, list(seen.items())


def _install(spec: dict) -> None:
    from odin_ns.trainer import OdinTrainer

    first, count, out = int(spec["first"]), int(spec["steps"]), Path(spec["out"])
    step_once = OdinTrainer.train_iteration
    traces: list[dict] = []

    def traced(self, step):
        if not first <= step < first + count:
            return step_once(self, step)
        result, files = trace_call(step_once, self, step)
        ordinary = all(name != "(not ordinary)" for name, _ in files)
        traces.append(
            {
                "step": step,
                "ordinary": ordinary,
                "files": [{"file": f, "first_function": fn} for f, fn in files if f[0] != "("],
            }
        )
        if len(traces) == count:
            first_ordinary = next((t for t in traces if t["ordinary"]), None)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(
                json.dumps(
                    {
                        "what": "the project's files one training step of rank 0 runs, in the "
                        "order their code first ran (sys.setprofile on the step's thread)",
                        "command": spec.get("command"),
                        "ordinary_step": first_ordinary,
                        "ordinary_files": None
                        if first_ordinary is None
                        else len(first_ordinary["files"]),
                        "steps": traces,
                    },
                    indent=1,
                )
            )
        return result

    OdinTrainer.train_iteration = traced


def main() -> None:
    from odin_ns import launch

    if "RANK" in os.environ:  # a rank
        spec = json.loads(os.environ.get(TRACE_ENV) or "{}")
        if spec and int(os.environ["RANK"]) == 0:
            _install(spec)
        launch.main(worker_module="odin_ns.bench.step_trace")
        return
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m odin_ns.bench.step_trace")
    parser.add_argument("--first", type=int, default=4, help="first traced step")
    parser.add_argument("--steps", type=int, default=8, help="steps traced")
    parser.add_argument("--out", type=Path, default=Path("bench/step_trace.json"))
    args = parser.parse_args(argv)
    spec = {
        "first": args.first,
        "steps": args.steps,
        "out": str(args.out.resolve()),
        "command": ["odin-ns-train", *rest],
    }
    os.environ[TRACE_ENV] = json.dumps(spec)
    sys.argv = [sys.argv[0], *rest]
    launch.main(worker_module="odin_ns.bench.step_trace")


if __name__ == "__main__":
    main()
