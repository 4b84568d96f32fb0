"""Input checks that fail with one clear line, shared by the launcher and the ranks.

``odin-ns-train`` runs them in its own process (``launch.check_run``), before torchrun
starts any rank and before any output folder exists; the data manager, model, pipeline and
sessions run the same ``check_*`` functions inside every rank (where ``ns-train`` or a
hand-made torchrun got there without the launcher). Each check raises
:class:`OdinInputError` with the message the user sees. A leaf: it imports nothing of the
project above ``errors`` and the rasterizer registry.
"""

from __future__ import annotations

import copy
import os
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from odin_ns.errors import OdinInputError, first_line

if TYPE_CHECKING:
    from nerfstudio.engine.trainer import TrainerConfig

# What nerfstudio's dataparsers and image loading raise on a malformed scene.
SCENE_ERRORS: tuple[type[Exception], ...] = (
    AssertionError,
    FileNotFoundError,
    IndexError,
    KeyError,
    ValueError,
)


# ------------------------------------------------------------------ the scene


def check_data_path(data: Path | str | None) -> Path:
    """The data path, which must exist."""
    if data is None or not Path(data).exists():
        raise OdinInputError(f"data path '{data}' does not exist (pass --data DIR)")
    return Path(data)


@contextmanager
def reading_scene(data: Path | str | None) -> Iterator[None]:
    """Turn a dataparser's or image loader's failure into one line naming the scene."""
    try:
        yield
    except SCENE_ERRORS as err:
        raise OdinInputError(f"could not read a scene from '{data}': {first_line(err)}") from err


def check_has_training_images(data: Path | str | None, num_images: int) -> None:
    if num_images == 0:
        raise OdinInputError(f"the scene at '{data}' has no training images")


def check_image_files(data: Path | str | None, filenames: Sequence[Path | str]) -> None:
    """Every image the dataparser lists exists (decoding them is the ranks' job)."""
    for name in filenames:
        if not Path(name).is_file():
            raise OdinInputError(f"could not read a scene from '{data}': image '{name}' is missing")


def count_training_views(dataparser_config: Any, data: Path | str) -> int:
    """Parse the scene once, as the data manager will (no image decoding), and check it."""
    parser_config = copy.deepcopy(dataparser_config)
    parser_config.data = Path(data)
    with reading_scene(data):
        parser = parser_config.setup()
        outputs = parser.get_dataparser_outputs(split="train")
        held_out = parser.get_dataparser_outputs(split="val").image_filenames
    check_has_training_images(data, len(outputs.image_filenames))
    # Evaluation images too: a missing one would otherwise fail the run at its first eval.
    check_image_files(data, [*outputs.image_filenames, *held_out])
    return len(outputs.image_filenames)


# ------------------------------------------------------------------ options


def check_rasterizer(name: str, device: str) -> None:
    """The rasterizer backend can run on this machine for a run on ``device`` (its
    ``--machine.device-type``, or the model's device): ``gsplat`` (``auto`` on a CUDA
    device) needs CUDA and gsplat's kernels, loaded here (built, the first time)."""
    import torch

    from odin_ns.render.api import resolve_backend
    from odin_ns.render.gsplat_backend import gsplat_kernels_missing

    on_cuda = torch.cuda.is_available() and torch.device(device).type == "cuda"
    try:
        backend = resolve_backend(name, "cuda" if on_cuda else "cpu")
    except ValueError as err:
        raise OdinInputError(str(err)) from err
    why = gsplat_kernels_missing() if backend == "gsplat" else None
    if why is not None:
        raise OdinInputError(
            f"rasterizer {name!r} draws with gsplat's CUDA kernels, which cannot run here: "
            f"{why}; install gsplat with kernels built for this torch and CUDA, or train "
            "with --pipeline.model.rasterizer torch (slow on a GPU)"
        )


def check_views_for_ranks(world_size: int, num_views: int) -> None:
    """Every rank needs at least one training view per step."""
    if num_views < world_size:
        raise OdinInputError(
            f"{world_size} ranks but only {num_views} training views: "
            "every rank needs at least one view per step"
        )


def check_mixed_precision(mixed_precision: bool, world_size: int) -> None:
    """Mixed precision trains one process only: the distributed step publishes float32
    gradient rows without a gradient scaler, so it would run float32 while saying otherwise."""
    if mixed_precision and world_size > 1:
        raise OdinInputError(
            "--mixed-precision True is for one process: the distributed step trains in float32 "
            "(its gradient rows are published unscaled); leave it off with several ranks"
        )


def check_dense_parameters(model_config: Any) -> None:
    """No dense extra parameters (camera optimizer, bilateral grid): Odin syncs primitives."""
    camera_optimizer = getattr(model_config, "camera_optimizer", None)
    camera_opt_on = camera_optimizer is not None and camera_optimizer.mode != "off"
    if camera_opt_on or getattr(model_config, "use_bilateral_grid", False):
        raise OdinInputError(
            "the camera optimizer and bilateral grid are dense parameters that Odin does not "
            "synchronize; run with --pipeline.model.camera-optimizer.mode off and "
            "--pipeline.model.use-bilateral-grid False"
        )


def check_process_group(world_size: int) -> None:
    """torch.distributed is initialised with exactly ``world_size`` ranks."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise OdinInputError(
            f"world size {world_size} but torch.distributed is not initialised; "
            "launch with `odin-ns-train --nproc-per-node N` or `ns-train --machine.num-devices N`"
        )
    if dist.get_world_size() != world_size:
        raise OdinInputError(
            f"world size {world_size} does not match the process group's "
            f"{dist.get_world_size()} ranks"
        )


def check_transport_option(transport: str, device_type: str, cuda_available: bool) -> None:
    """``--pipeline.sync.transport nccl`` moves publications between GPUs: refused for CPU
    ranks before any rank starts (ranks sharing a GPU are refused by the ranks themselves,
    ``runtime.transport_choice``, once every rank's device is known)."""
    if transport == "nccl" and (device_type == "cpu" or not cuda_available):
        raise OdinInputError(
            "--pipeline.sync.transport nccl moves publications between GPUs, and this run's "
            "ranks are on the CPU; use --pipeline.sync.transport auto (or gloo)"
        )


def check_distributed_setup(world_size: int, num_views: int, model_config: Any) -> None:
    """Everything OdinPipeline needs of a run on ``world_size`` > 1 ranks, in one call."""
    check_process_group(world_size)
    check_views_for_ranks(world_size, num_views)
    check_dense_parameters(model_config)


def check_checkpoint_exists(path: Path | None) -> None:
    if path is not None and not Path(path).is_file():
        raise OdinInputError(f"cannot resume from checkpoint '{path}': it does not exist")


def check_checkpoint_readable(path: Path | None) -> None:
    """A whole ``torch.save`` archive whose records pass their CRC check (reads the file
    once, unpickles nothing): a truncated or corrupt checkpoint fails here in seconds,
    not after every rank has started."""
    if path is None:
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise OdinInputError(
            f"cannot resume from checkpoint '{path}': not a complete checkpoint ({first_line(err)})"
        ) from err
    if bad is not None:
        raise OdinInputError(f"cannot resume from checkpoint '{path}': record '{bad}' is corrupt")


def resume_checkpoint(config: TrainerConfig) -> Path | None:
    """The checkpoint ``--load-checkpoint`` / ``--load-dir`` (latest or ``--load-step``) name."""
    if config.load_dir is not None:
        if config.load_step is not None:
            return Path(config.load_dir) / f"step-{config.load_step:09d}.ckpt"
        found = sorted(Path(config.load_dir).glob("step-*.ckpt"))
        return found[-1] if found else None  # none: the trainer says so
    return Path(config.load_checkpoint) if config.load_checkpoint is not None else None


def gaussian_row_shapes(model_config: Any) -> dict[str, tuple[int, ...]] | None:
    """Per-row shape of each Gaussian group splatfacto builds from ``model_config`` (None
    for a model without Gaussians): ``features_rest`` has ``(sh_degree + 1)^2 - 1`` bases."""
    sh_degree = getattr(model_config, "sh_degree", None)
    if sh_degree is None:
        return None
    return {
        "means": (3,),
        "scales": (3,),
        "quats": (4,),
        "features_dc": (3,),
        "features_rest": ((int(sh_degree) + 1) ** 2 - 1, 3),
        "opacities": (1,),
    }


def check_checkpoint_gaussians(
    path: Path | str,
    pipeline_state: Mapping[str, Any],
    optimizers_state: Mapping[str, Any] | None,
    row_shapes: Mapping[str, tuple[int, ...]],
) -> int:
    """The checkpoint's Gaussians fit the model the config builds: every group present, the
    same row count N in every group, each group's row shape as ``row_shapes`` says (a
    different ``--pipeline.model.sh-degree`` changes ``features_rest``), and the Adam moments
    (where saved) shaped like their parameters. Returns N."""
    prefix = f"cannot resume from checkpoint '{path}':"
    params = {}
    for name in row_shapes:
        tensor = pipeline_state.get(f"_model.gauss_params.{name}")
        if tensor is None:  # splatfacto's older naming, which its load_state_dict remaps
            tensor = pipeline_state.get(f"_model.{name}")
        if tensor is None:
            raise OdinInputError(f"{prefix} it has no Gaussian group '{name}'")
        params[name] = tensor
    rows = {name: int(t.shape[0]) if t.dim() else -1 for name, t in params.items()}
    if len(set(rows.values())) != 1:
        counts = ", ".join(f"{name} {n}" for name, n in rows.items())
        raise OdinInputError(f"{prefix} its Gaussian groups have different row counts ({counts})")
    for name, expected in row_shapes.items():
        got = tuple(int(d) for d in params[name].shape[1:])
        if got != tuple(expected):
            raise OdinInputError(
                f"{prefix} its '{name}' rows are {list(got)} but this config builds "
                f"{list(expected)} (trained with another --pipeline.model.sh-degree?)"
            )
    for name, param in params.items():
        state = ((optimizers_state or {}).get(name) or {}).get("state") or {}
        for key in ("exp_avg", "exp_avg_sq"):
            moment = state.get(0, {}).get(key)
            if moment is not None and tuple(moment.shape) != tuple(param.shape):
                raise OdinInputError(
                    f"{prefix} the Adam moment {key} of '{name}' is {list(moment.shape)}, "
                    f"its parameters {list(param.shape)}"
                )
    return next(iter(rows.values()))


def check_checkpoint_fits_config(path: Path | None, model_config: Any) -> int | None:
    """The launcher's :func:`check_checkpoint_gaussians`: reads the checkpoint's tensor
    shapes through a memory map (no tensor data is read). Returns the checkpoint's number
    of Gaussians, or None (no checkpoint, not a splatfacto model, or a checkpoint that only
    a full unpickle can read: the ranks run the same check)."""
    row_shapes = gaussian_row_shapes(model_config)
    if path is None or row_shapes is None:
        return None
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - not weights-only loadable: the ranks check it
        return None
    if not (isinstance(state, Mapping) and isinstance(state.get("pipeline"), Mapping)):
        return None
    return check_checkpoint_gaussians(path, state["pipeline"], state.get("optimizers"), row_shapes)


def check_checkpoint_row_cap(
    path: Path | str, num_rows: int, world_size: int, max_rows_per_rank: int, parallel: str
) -> None:
    """``--pipeline.max-rows-per-rank`` for a run resumed from a checkpoint of ``num_rows``
    Gaussians, before any of them is read: replicated training loads every row on every
    rank; sharded training loads a contiguous range per rank (the largest has
    ceil(N / R) rows), then moves rows to their owners."""
    if max_rows_per_rank <= 0:
        return
    if parallel != "sharded":
        check_row_cap(num_rows, max_rows_per_rank, f"in checkpoint '{path}'")
        return
    largest = -(-num_rows // world_size)
    if largest > max_rows_per_rank:
        raise OdinInputError(
            f"--pipeline.max-rows-per-rank {max_rows_per_rank}: resuming from '{path}' reads "
            f"{largest} of its {num_rows} Gaussians on one of {world_size} ranks; raise the "
            "cap or train on more ranks"
        )


def check_row_cap_option(max_rows_per_rank: int) -> None:
    if int(max_rows_per_rank) < 0:
        raise OdinInputError(
            f"--pipeline.max-rows-per-rank must be >= 0 (0: no cap), got {max_rows_per_rank}"
        )


def check_row_cap(num_rows: int, max_rows_per_rank: int, when: str) -> None:
    """Replicated training holds every Gaussian on every rank: at most
    ``--pipeline.max-rows-per-rank`` (0: no cap)."""
    check_row_cap_option(max_rows_per_rank)
    if max_rows_per_rank > 0 and num_rows > max_rows_per_rank:
        raise OdinInputError(
            f"--pipeline.max-rows-per-rank {max_rows_per_rank}: the model has {num_rows} "
            f"Gaussians {when}, and replicated training holds all of them on every rank; "
            "train with --pipeline.parallel sharded or raise the cap"
        )


def check_output_writable(output_dir: Path | str) -> None:
    """The output folder (or its nearest existing parent) can be written to."""
    path = Path(output_dir).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not os.access(path, os.W_OK | os.X_OK):
        raise OdinInputError(
            f"output folder '{output_dir}' is not writable ('{path}' is read-only)"
        )


def check_sharded_config(trainer_config, world_size: int) -> None:
    """One clear line for what sharded mode does not do (yet); config-only (the launcher runs
    it before any rank starts, the trainer again in every rank)."""
    config = trainer_config.pipeline
    if world_size < 2:
        raise OdinInputError(
            "--pipeline.parallel sharded needs at least 2 ranks (launch with "
            "odin-ns-train --nproc-per-node N); one process holds the whole model anyway"
        )
    check_dense_parameters(config.model)
    if config.sync.mode not in ("quality-first", "barrier", "throughput-first"):
        raise OdinInputError(
            f"--pipeline.parallel sharded runs quality-first, barrier or throughput-first; "
            f"sync mode '{config.sync.mode}' is a replicated baseline (use "
            "--pipeline.parallel replicated)"
        )
    check_row_cap_option(getattr(config, "max_rows_per_rank", 0))
    cap = int(getattr(config, "eval_copy_max_rows", 0))
    if cap < 0:
        raise OdinInputError(f"--pipeline.eval-copy-max-rows must be >= 0 (0: no bound), got {cap}")
