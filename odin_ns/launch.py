"""``odin-ns-train``: multi-process training on CPUs (gloo) or several machines, via torchrun.

``ns-train --machine.num-devices N`` spawns GPU workers with NCCL and refuses to run
without CUDA. This entry point covers the rest with PyTorch's own launcher:

    odin-ns-train --nproc-per-node 2 odin-splatfacto --data DIR          # one machine
    odin-ns-train --nnodes 2 --node-rank 0 --master-addr HOST --nproc-per-node 4 \
        odin-splatfacto --data DIR                                        # multi-node

Without ``RANK`` in the environment it re-executes itself under ``torch.distributed.run``;
inside each worker it builds the same tyro config as ``ns-train``, initialises the process
group from torchrun's environment and runs nerfstudio's own train loop. torchrun ends all
workers when one fails, so a dead rank never leaves the others hanging.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from datetime import timedelta


def _split_launcher_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="odin-ns-train",
        description="Run `ns-train`-style training on several processes with torchrun.",
        add_help=False,
    )
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--distributed-timeout-s", type=float, default=300.0)
    known, rest = parser.parse_known_args(argv)
    if known.nproc_per_node < 1 or known.nnodes < 1:
        parser.error("--nproc-per-node and --nnodes must be at least 1")
    return known, rest


def _run_torchrun(args: argparse.Namespace, rest: list[str], worker_module: str) -> int:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={args.nproc_per_node}",
        f"--nnodes={args.nnodes}",
        f"--node-rank={args.node_rank}",
        f"--master-addr={args.master_addr}",
        f"--master-port={args.master_port}",
        "-m",
        worker_module,
        f"--distributed-timeout-s={args.distributed_timeout_s}",
        *rest,
    ]
    env = dict(os.environ)
    # Ranks share the machine's cores: spinning OpenMP workers steal them from each other.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return subprocess.call(cmd, env=env)


def _bind_cuda_device(config, local_rank: int, local_world_size: int) -> str:
    """Bind this rank to a GPU; return the default process group's backend.

    Rule: local rank ``i`` uses ``cuda:{i % torch.cuda.device_count()}``. With at least one
    GPU per local rank that is ``cuda:{i}`` and NCCL, as ``ns-train`` does. With fewer GPUs
    than local ranks, ranks share devices round-robin; NCCL cannot hold two ranks on one
    device, so the default group is gloo (the Odin runtime runs over gloo anyway), and the
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
    import torch
    import torch.distributed as dist
    import tyro
    from nerfstudio.configs.method_configs import AnnotatedBaseConfigUnion
    from nerfstudio.scripts.train import train_loop
    from nerfstudio.utils import comms

    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    config = tyro.cli(AnnotatedBaseConfigUnion, args=rest)
    if config.data:
        config.pipeline.datamanager.data = config.data
    device_type = config.machine.device_type
    if device_type == "cuda" and not torch.cuda.is_available():
        device_type = config.machine.device_type = "cpu"
    if device_type == "cpu":
        # Ranks on one machine share its cores; oversubscription slows every rank.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))
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
    try:
        train_loop(local_rank, world_size, config, global_rank=rank)
    finally:
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
    sys.exit(_run_torchrun(args, rest, worker_module))


if __name__ == "__main__":
    main()
