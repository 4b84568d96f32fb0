"""``odin-ns-train``: multi-process training on CPUs (gloo) or several machines, via torchrun.

``ns-train --machine.num-devices N`` spawns GPU workers with NCCL and refuses to run
without CUDA. This entry point covers the rest with PyTorch's own launcher:

    odin-ns-train --nproc-per-node 2 odin-splatfacto --data DIR          # one machine
    odin-ns-train --nnodes 2 --node-rank 0 --master-addr HOST --nproc-per-node 4 \
        odin-splatfacto --data DIR                                        # multi-node

Without ``RANK`` in the environment it is the launcher: it parses the same tyro config the
ranks will, runs the checks of :func:`check_run` (``odin_ns.preflight``'s: data path,
images, world size against views, options that cannot run distributed) before any rank or
output folder exists, then runs torchrun's agent (``torch.distributed.run``) with this module (or
``worker_module``) as each rank. Inside each worker it builds the config, initialises the
process group from torchrun's environment and runs nerfstudio's own train loop. torchrun
ends all workers when one fails, so a dead rank never leaves the others hanging.

How ranks start (:func:`rank_start_method`): CPU ranks are forked from the launcher, which
has already imported nerfstudio for its checks (about 10 CPU-seconds a process), and run
the worker module as ``python -m`` would (:class:`ForkedRank`); GPU ranks are started
fresh (``python -u -m``), since a CUDA context does not survive a fork. GNU OpenMP's
thread pool does not survive a fork either (a forked child waits forever for the
parent's pool threads), so the launcher computes with one thread and never starts it.

Failures end with one line, last: ``odin-ns-train: error: <reason>``. A rank that fails
with a reason (``OdinInputError``, ``SyncTimeout`` / ``PeerFailure``, ``FloatingPointError``)
appends ``rank R: ...`` to the file named by ``ODIN_NS_FAILURE_FILE`` (chosen per run by the
launcher) and exits 1 quietly; after torchrun's report the launcher prints the earliest
reason, or the root-cause rank's exit code or signal when it left none.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import runpy
import shutil
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from odin_ns.errors import OdinInputError, first_line, rank_reason

if TYPE_CHECKING:
    from nerfstudio.engine.trainer import TrainerConfig

FAILURE_FILE_ENV = "ODIN_NS_FAILURE_FILE"
PROG = "odin-ns-train"
TORCHRUN_FORK_LOGGER = "torch.distributed.elastic.multiprocessing.api"  # logs forked ranks' exits
# A rank's SIGKILL is most often the kernel's out-of-memory killer (full-size photos of a
# real capture on a small machine); the line says so, since the rank could not.
OOM_HINT = (
    " (the out-of-memory killer's signal, unless you sent it: see dmesg; a larger"
    " --downscale-factor or fewer ranks per machine use less memory)"
)
RANK_PROCESS_NAME = "odin-ns-rank"  # + the rank: what ps and top show for each rank


def _split_launcher_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run `ns-train`-style training on several processes with torchrun.",
        add_help=False,
    )
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--distributed-timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="torch's deterministic kernels in every rank (use_deterministic_algorithms)",
    )
    parser.add_argument(
        "--start-method",
        choices=("auto", "fork", "spawn"),
        default="auto",
        help="how ranks start: auto forks CPU ranks and spawns GPU ranks (rank_start_method)",
    )
    known, rest = parser.parse_known_args(argv)
    if known.nproc_per_node < 1 or known.nnodes < 1:
        parser.error("--nproc-per-node and --nnodes must be at least 1")
    return known, rest


def _torchrun_args(
    args: argparse.Namespace,
    rest: list[str],
    worker_module: str,
    start_method: str,
    log_dir: Path | None = None,
) -> list[str]:
    """Arguments of ``python -m torch.distributed.run`` that run ``worker_module`` per rank
    (``log_dir``: torchrun's error files; without it torchrun makes a ``torchelastic_*``
    folder in the temp folder per run and leaves it there)."""
    return [
        f"--start-method={start_method}",
        *([f"--log-dir={log_dir}"] if log_dir is not None else []),
        f"--nproc-per-node={args.nproc_per_node}",
        f"--nnodes={args.nnodes}",
        f"--node-rank={args.node_rank}",
        f"--master-addr={args.master_addr}",
        f"--master-port={args.master_port}",
        "-m",
        worker_module,
        f"--distributed-timeout-s={args.distributed_timeout_s}",
        *(["--deterministic"] if args.deterministic else []),
        *rest,
    ]


def _fail(reason: str, code: int = 1) -> NoReturn:
    """End the launcher with ``reason`` as the last line printed."""
    sys.stdout.flush()
    print(f"{PROG}: error: {reason}", file=sys.stderr, flush=True)
    sys.exit(code)


def parse_training_config(args: Sequence[str]) -> TrainerConfig:
    """The ``ns-train``-style tyro config, exactly as every rank parses it."""
    import tyro

    from odin_ns.method_registry import method_registry

    config = tyro.cli(method_registry().AnnotatedBaseConfigUnion, args=list(args))
    if config.data:
        config.pipeline.datamanager.data = config.data
    return config


def check_run(config: TrainerConfig, world_size: int) -> None:
    """What a run on ``world_size`` ranks can be checked for before any rank starts
    (``odin_ns.preflight``'s checks). Cheap checks first (paths, options), then one parse
    of the scene's training split. Creates nothing."""
    import torch

    from odin_ns import preflight as checks
    from odin_ns.pipeline import OdinPipelineConfig

    pipeline = config.pipeline
    odin = isinstance(pipeline, OdinPipelineConfig)
    datamanager = pipeline.datamanager
    data = checks.check_data_path(datamanager.data or datamanager.dataparser.data)
    checks.check_checkpoint_exists(config.load_checkpoint)
    checkpoint = checks.resume_checkpoint(config)
    checks.check_checkpoint_readable(checkpoint)
    checkpoint_rows = checks.check_checkpoint_fits_config(checkpoint, pipeline.model)
    checks.check_output_writable(config.output_dir)
    if odin:
        checks.check_row_cap_option(pipeline.max_rows_per_rank)
        checks.check_transport_option(
            pipeline.sync.transport, config.machine.device_type, torch.cuda.is_available()
        )
        if checkpoint_rows is not None:
            checks.check_checkpoint_row_cap(
                checkpoint, checkpoint_rows, world_size, pipeline.max_rows_per_rank,
                pipeline.parallel,
            )  # fmt: skip
    if hasattr(pipeline.model, "rasterizer"):
        checks.check_rasterizer(pipeline.model.rasterizer, config.machine.device_type)
    if odin and pipeline.parallel == "sharded":
        checks.check_sharded_config(config, world_size)
    distributed = world_size > 1 and odin
    if distributed:
        checks.check_dense_parameters(pipeline.model)
        checks.check_mixed_precision(config.mixed_precision, world_size)
    num_views = checks.count_training_views(datamanager.dataparser, data)
    if distributed:
        checks.check_views_for_ranks(world_size, num_views)


def _preflight(args: argparse.Namespace, rest: list[str]) -> TrainerConfig:
    """Check the run in this process and return its config; exit 2 (bad arguments) or 1
    (bad input) on failure."""
    try:
        with warnings.catch_warnings():  # nerfstudio's import-time deprecations: the ranks say them
            warnings.simplefilter("ignore", FutureWarning)
            config = parse_training_config(rest)
    except SystemExit as exit_:
        if exit_.code in (0, None):  # --help
            raise
        _fail("invalid training arguments (see the message above)", code=2)
    try:
        check_run(config, args.nproc_per_node * args.nnodes)
    except OdinInputError as err:
        _fail(err.message)
    return config


def prepare_ranks(args: argparse.Namespace, rest: list[str]) -> tuple[str, dict[str, str]]:
    """The launcher's work before torchrun: check the run (:func:`_preflight`) and return
    how its ranks start (``--start-method``; ``auto``: :func:`rank_start_method`) and what
    their environment gets (:func:`rank_environment`)."""
    import torch

    # GNU OpenMP's thread pool does not survive a fork: a forked rank would wait forever for
    # pool threads that exist only here. The launcher computes little: one thread, no pool.
    torch.set_num_threads(1)
    config = _preflight(args, rest)
    env = rank_environment(config, args.nproc_per_node * args.nnodes)
    if args.start_method != "auto":
        return args.start_method, env
    return rank_start_method(config.machine.device_type), env


def rank_start_method(device_type: str) -> str:
    """How torchrun starts this node's ranks for ``--machine.device-type``: ``"fork"`` for
    CPU ranks (no new interpreter, no second import of nerfstudio), ``"spawn"`` (a fresh
    ``python -u -m`` per rank) where ranks may use a GPU. ``cuda`` without a GPU trains on
    the CPU (:func:`_train_rank`), so it forks too."""
    if device_type == "cpu":
        return "fork"
    if device_type == "cuda":
        import torch

        return "spawn" if torch.cuda.is_available() else "fork"
    return "spawn"


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set (torchrun's children inherit it), then restored."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def record_failure(path: Path, reason: str) -> None:
    """Append one rank's one-line reason (with the time) to the run's failure file."""
    line = f"{time.time():.6f}\t{' '.join(reason.split())}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one small O_APPEND write: ranks never interleave
    finally:
        os.close(fd)


def read_failures(path: Path) -> list[tuple[float, str]]:
    """The reasons ranks wrote, earliest first."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        stamp, _, reason = line.partition("\t")
        if reason:
            rows.append((float(stamp), reason))
    return sorted(rows)


def _failure_reason(written: list[tuple[float, str]], err) -> str:
    """The line to print last for torchrun's ``ChildFailedError``.

    A root-cause rank killed by a signal without a word wins (its peers' reasons describe
    the consequence); else the earliest reason written; else the root cause's exit code.
    """
    rank, failure = err.get_first_failure()
    spoke = any(reason.startswith(f"rank {rank}:") for _, reason in written)
    if failure.exitcode < 0 and not spoke:
        reason = f"rank {rank} was killed by {failure.signal_name()}"
        return reason + OOM_HINT if failure.exitcode == -signal.SIGKILL else reason
    if written:
        return written[0][1]
    return f"rank {rank} exited with code {failure.exitcode}"


class ForkedRank:
    """torchrun's entrypoint for ranks forked from the launcher: ``python -u -m module``,
    run in the launcher's already initialised interpreter. Its ``__name__`` and
    ``__qualname__`` (which torchrun's agent reads from a function entrypoint) are the
    module: torchrun's report names the ranks as it does for ``python -m module``."""

    def __init__(self, module: str) -> None:
        self.module = self.__name__ = self.__qualname__ = module

    def __call__(self, *argv: str) -> None:
        # The launcher's torchrun agent turns these signals into exceptions; a rank dies of them.
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True)  # lines reach a log as they are printed
        sys.argv = [self.module, *argv]
        with warnings.catch_warnings():  # the module is imported here already: expected
            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
            runpy.run_module(self.module, run_name="__main__", alter_sys=True)


def _without_traceback(record: logging.LogRecord) -> bool:
    """Keep a log line, drop its traceback: torchrun logs a forked rank's exit with the
    traceback of its own polling loop (torch internals, not the rank's error, which the
    rank wrote to the failure file and the launcher prints last)."""
    record.exc_info = record.exc_text = None
    return True


def _run_torchrun(
    args: argparse.Namespace,
    rest: list[str],
    worker_module: str,
    start_method: str,
    rank_env: dict[str, str] | None = None,
) -> int:
    """Run torchrun's agent here (``python -m torch.distributed.run`` in this process).

    In-process so that a failed run ends with torchrun's report and then the reason, not
    with the ``ChildFailedError`` traceback of a torchrun subprocess. ``start_method``:
    ``"spawn"`` runs ``python -u -m worker_module`` per rank, ``"fork"``
    :class:`ForkedRank`; ``rank_env``: more of the ranks' environment
    (:func:`rank_environment`).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args, run

    run_dir = Path(tempfile.mkdtemp(prefix="odin-ns-train-"))
    failure_file = run_dir / "failures.tsv"
    env = {
        FAILURE_FILE_ENV: str(failure_file),
        # Ranks share the machine's cores: spinning OpenMP workers steal them from each other.
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        **(rank_env or {}),
    }
    torchrun = parse_args(
        _torchrun_args(args, rest, worker_module, start_method, run_dir / "torchrun")
    )
    try:
        with environment(env):
            if start_method == "fork":
                logging.getLogger(TORCHRUN_FORK_LOGGER).addFilter(_without_traceback)
                # The launcher's objects (nerfstudio's and torch's imports, ~a million) live
                # on in every forked rank: frozen, the ranks' collections skip them (and
                # leave their memory pages shared).
                gc.freeze()
                launch_config, _, _ = config_from_args(torchrun)
                ranks = elastic_launch(launch_config, entrypoint=ForkedRank(worker_module))
                ranks(*torchrun.training_script_args)
            else:
                run(torchrun)
    except ChildFailedError as err:
        print(err.format_msg(), file=sys.stderr)  # torchrun's own report
        _fail(_failure_reason(read_failures(failure_file), err))
    except SignalException as err:
        _fail(f"stopped by {err.sigval.name}", code=128 + int(err.sigval))
    except Exception as err:  # rendezvous, port in use, ...: torchrun could not start the ranks
        _fail(f"torchrun failed: {first_line(err)}")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


def _bind_cuda_device(config, local_rank: int, local_world_size: int) -> str:
    """Bind this rank to a GPU; return the default process group's backend.

    Rule: local rank ``i`` uses ``cuda:{i % torch.cuda.device_count()}``. With at least one
    GPU per local rank that is ``cuda:{i}`` and NCCL, as ``ns-train`` does. With fewer GPUs
    than local ranks, ranks share devices round-robin; NCCL cannot hold two ranks on one
    device, so the default group is gloo (publications then take the gloo transport), and the
    device is pinned in ``config.machine.device_type`` (``cuda:K``) because nerfstudio's
    Trainer would otherwise use ``cuda:{local_rank}``. Every node must have as many GPUs.
    """
    import torch

    count = torch.cuda.device_count()
    index = local_rank % count
    torch.cuda.set_device(index)
    if count >= local_world_size:
        return "nccl"
    config.machine.device_type = f"cuda:{index}"
    if local_rank == 0:
        print(
            f"odin-ns-train: {local_world_size} ranks share {count} GPU(s) round-robin; "
            "default process group: gloo",
            flush=True,
        )
    return "gloo"


def _worker(args: argparse.Namespace, rest: list[str]) -> None:
    """One torchrun rank; a failure with a reason goes to the launcher's failure file."""
    from odin_ns.runtime.errors import SyncError

    rank = int(os.environ["RANK"])
    failure_file = os.environ.get(FAILURE_FILE_ENV)
    name_process(f"{RANK_PROCESS_NAME}{rank}")
    try:
        _train_rank(args, rest)
    except (OdinInputError, SyncError, FloatingPointError) as err:
        if not failure_file:
            _end_nccl_rank(err)
            raise
        record_failure(Path(failure_file), rank_reason(rank, err))
        _end_nccl_rank(None)
        sys.exit(1)  # quietly: the launcher prints the reason last
    except Exception as err:
        if failure_file:
            record_failure(Path(failure_file), rank_reason(rank, err, with_type=True))
        _end_nccl_rank(err)
        raise


def _end_nccl_rank(err: BaseException | None) -> None:
    """End a failed rank now (printing ``err``'s traceback, if any) where its process
    groups are alive: ``_train_rank`` leaves them so where publications may travel over
    NCCL (whatever the default group's backend), since destroying them waits for the device
    operations in flight and a failed run leaves sends that no peer will receive: the rank
    would hang until NCCL's watchdog killed it, its reason lost. Otherwise, nothing."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if err is not None:
        traceback.print_exception(err)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def usable_cores() -> int:
    """The cores this process may run on (Linux affinity; elsewhere every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def name_process(name: str) -> None:
    """Show ``name`` (at most 15 bytes) as this process's name in ``ps`` and ``top``: forked
    ranks share the launcher's command line. Linux only; elsewhere nothing changes."""
    try:
        Path("/proc/self/comm").write_text(name[:15])
    except OSError:
        pass


def use_deterministic_algorithms() -> None:
    """torch's deterministic kernels in this rank (``--deterministic``), before CUDA starts.

    On CUDA, scatter-adds with repeated indices (``index_add_``, ``index_put_`` with
    accumulate: the torch rasterizer's backward) add in whatever order the atomics land, so
    two runs of one command differ in the last bits, and after the first densification in
    their Gaussians (on an H200, 48,617 against 48,459 after 150 steps). With this, two runs
    compare bitwise there as they do on CPUs; ``warn_only``: an op without a deterministic
    kernel warns with its name instead of ending the run. cuBLAS needs a fixed workspace
    for it. Costs speed: for checks and reproductions, not for training runs.
    """
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


def may_use_nccl(config: TrainerConfig) -> bool:
    """Whether the run's publications may travel over NCCL (an Odin pipeline whose
    transport is not forced to gloo; the rule itself runs once every rank has started)."""
    from odin_ns.pipeline import OdinPipelineConfig

    pipeline = config.pipeline
    return isinstance(pipeline, OdinPipelineConfig) and pipeline.sync.transport != "gloo"


def rank_environment(config: TrainerConfig, world_size: int) -> dict[str, str]:
    """What the launcher adds to its ranks' environment, there before a rank starts.

    Ranks whose publications may travel over NCCL (CUDA, several ranks,
    :func:`may_use_nccl`) have CUDA load every kernel when the rank starts it
    (``CUDA_MODULE_LOADING=EAGER``, unless the user set it). torch has kernels loaded
    lazily, at their first launch, and a load may wait for the kernels running on the
    device (CUDA programming guide, lazy loading: concurrent execution). Over NCCL a send
    spins on the GPU until the peer's host posts the receive; two ranks sending to each
    other whose hosts both reach a kernel's first launch would each wait for the other's
    spinning send: for good. Set by the launcher, not in the rank: a rank's imports start
    CUDA (the method config asks ``torch.cuda.is_available()``), and torch itself sets
    ``LAZY`` where the variable is unset when it first initializes CUDA. Costs start-up
    time and device memory for kernels that never run, also where ranks turn out to share a
    GPU (gloo then; whether they do is known only once every rank has started):
    ``--pipeline.sync.transport gloo`` or ``CUDA_MODULE_LOADING=LAZY`` avoids it."""
    eager = (
        config.machine.device_type == "cuda"
        and world_size > 1
        and may_use_nccl(config)
        and "CUDA_MODULE_LOADING" not in os.environ
    )
    return {"CUDA_MODULE_LOADING": "EAGER"} if eager else {}


def _train_rank(args: argparse.Namespace, rest: list[str]) -> None:
    import torch
    import torch.distributed as dist

    if args.deterministic:
        use_deterministic_algorithms()

    from odin_ns.method_registry import method_registry

    method_registry()  # a spawned rank imports it here: cheaply
    from nerfstudio.scripts.train import train_loop
    from nerfstudio.utils import comms

    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    config = parse_training_config(rest)
    device_type = config.machine.device_type
    nccl = device_type == "cuda" and world_size > 1 and may_use_nccl(config)
    if device_type == "cuda" and not torch.cuda.is_available():
        device_type = config.machine.device_type = "cpu"
        nccl = False
    # Ranks on one machine share the cores this process may run on (its affinity: a
    # container's or taskset's); oversubscription slows every rank. GPU ranks too: their
    # phase starts run host kernels, and torchrun leaves them one thread
    # (OMP_NUM_THREADS=1 where a node runs several ranks).
    torch.set_num_threads(max(1, usable_cores() // local_world_size))
    if device_type == "cpu":
        backend = "gloo"
    else:
        backend = _bind_cuda_device(config, local_rank, local_world_size)
    config.machine.num_devices = local_world_size
    config.machine.num_machines = world_size // local_world_size
    config.machine.machine_rank = rank // local_world_size

    dist.init_process_group(
        backend=backend,
        timeout=timedelta(seconds=args.distributed_timeout_s),
    )
    trained = False
    try:
        # Every rank must write to the same run directory: rank 0 picks the timestamp.
        if rank == 0:
            config.set_timestamp()
        stamp = [config.timestamp]
        dist.broadcast_object_list(stamp, src=0)
        config.timestamp = stamp[0]
        if rank == 0:
            config.print_to_terminal()
            config.save_config()
        # Like nerfstudio's own launcher: one process group per machine (every rank creates all).
        for machine in range(config.machine.num_machines):
            ranks = list(range(machine * local_world_size, (machine + 1) * local_world_size))
            group = dist.new_group(ranks)
            if machine == config.machine.machine_rank:
                comms.LOCAL_PROCESS_GROUP = group
        train_loop(local_rank, world_size, config, global_rank=rank)
        trained = True
    finally:
        # A failed rank whose publications may travel over NCCL leaves its groups alive for
        # _end_nccl_rank: destroying them would wait for sends no peer will receive.
        if trained or not nccl:
            dist.destroy_process_group()


def main(argv: list[str] | None = None, worker_module: str = "odin_ns.launch") -> None:
    """Launch (no ``RANK`` in the environment) or be one torchrun worker.

    ``worker_module`` is the module torchrun runs as each worker (``python -m``); a wrapper
    module (a benchmark) that calls ``main(worker_module="pkg.wrapper")`` (its own name;
    ``__name__`` is ``"__main__"`` under ``python -m``) runs itself in every rank, so it can
    set things up before training.
    """
    args, rest = _split_launcher_args(list(sys.argv[1:] if argv is None else argv))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        _worker(args, rest)
        return
    # The preflight imports nerfstudio and torch: about a million objects that live as long
    # as the launcher (and in every forked rank). Collecting while they are made walks them
    # again and again (1 s of a 4.5 s import here); instead they are frozen before the ranks
    # fork (Python's recipe for forking servers: disable, freeze before fork).
    gc.disable()
    try:
        start_method, rank_env = prepare_ranks(args, rest)
    finally:
        gc.enable()
    sys.exit(_run_torchrun(args, rest, worker_module, start_method, rank_env))


if __name__ == "__main__":
    main()
