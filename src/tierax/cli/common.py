"""What every verb shares: the console, model and plan options, checked sizes, progress."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Iterator, Sequence

from tierax.errors import TieraxError


def console(stderr: bool = False):
    from rich.console import Console

    c = Console(stderr=stderr)
    if not c.is_terminal:  # pipes and CI: wide enough for the tables
        c = Console(stderr=stderr, width=160)
    return c


def _whole_number(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number ≥ {minimum}, got {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be ≥ {minimum}, got {value}")
        return value

    parse.__name__ = f"whole number ≥ {minimum}"  # argparse names the type in its messages
    return parse


# argparse types: errors become exit 2 with the usage line.
positive_int = _whole_number(1)
nonnegative_int = _whole_number(0)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (``nan``, ``inf`` and 0 refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """argparse type: a finite number ≥ 0 (``nan`` and ``inf`` refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number ≥ 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number ≥ 0, got {text!r}")
    return value


def add_set_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config field, e.g. --set d_model=512 (repeatable)",
    )


def add_model_args(parser: argparse.ArgumentParser, *, default: str | None = "tiny-llama") -> None:
    """``--model NAME``, ``--model-config FILE`` and repeated ``--set KEY=VALUE`` (read by
    :func:`resolve_model`)."""
    suffix = f" (default: {default})" if default else ""
    parser.add_argument(
        "--model", metavar="NAME", help=f"named model config, see `tierax models`{suffix}"
    )
    parser.add_argument(
        "--model-config",
        metavar="FILE",
        help="model config YAML (family + fields, as `tierax models show NAME` prints)",
    )
    add_set_arg(parser)
    parser.set_defaults(model_default=default)


class _Given(argparse.Action):
    """Store the value and record that it was given (``args.<dest>_given``): a default and an
    explicit value equal to it are told apart."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, self.dest + "_given", True)


def add_size_args(
    parser: argparse.ArgumentParser, *, microbatch: int, seq: int = 64, per_device: bool = True
) -> None:
    what = "sequences per device" if per_device else "sequences in the batch"
    parser.add_argument(
        "--microbatch",
        type=positive_int,
        default=microbatch,
        action=_Given,
        help=f"{what} (default {microbatch}, or the microbatch a plan file carries)",
    )
    parser.set_defaults(microbatch_given=False, microbatch_per_device=per_device)
    parser.add_argument(
        "--seq", type=positive_int, default=seq, help=f"sequence length (default {seq})"
    )


def add_grad_accum_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--grad-accum",
        type=positive_int,
        default=None,
        metavar="N",
        help="microbatches per optimizer update, their gradients summed in a float32 accumulator "
        "(default 1, or what a plan file carries); a plan's state may offload the accumulator "
        "(grad_accum: offload) when N > 1",
    )


def resolve_model(args, extra_overrides: Sequence[str] = (), *, target: str | None = None):
    """The ModelConfig selected by :func:`add_model_args` options, overrides applied in order;
    with ``target``, ``attention: auto`` chosen for the platform that target runs on."""
    from tierax import hardware
    from tierax.interop.files import load_model_config
    from tierax.models import (
        NAMED_CONFIGS,
        apply_overrides,
        for_platform,
        get_config,
        require_quantization_runs,
    )

    if args.model is not None and args.model_config is not None:
        raise TieraxError(
            "--model and --model-config both given; use one: --model NAME for a named config "
            "or --model-config FILE for a config file"
        )
    if args.model_config is not None:
        cfg = load_model_config(args.model_config)
    elif args.model is not None or args.model_default:
        cfg = get_config(args.model if args.model is not None else args.model_default)
    else:
        raise TieraxError(
            f"no model given; use --model NAME ({', '.join(NAMED_CONFIGS)}) or --model-config FILE"
        )
    cfg = apply_overrides(cfg, [*args.overrides, *extra_overrides])
    if target is None:
        return cfg
    platform = hardware.platform(target)
    if cfg.attention == "cudnn" and platform != "gpu":
        raise TieraxError(
            f"attention=cudnn runs cuDNN's fused kernel on CUDA GPUs only; target {target} is a "
            f"{platform}: use attention=splash (its kernel) or auto, or blockwise"
        )
    if cfg.attention == "splash" and platform == "gpu":
        raise TieraxError(
            f"attention=splash is the Pallas TPU kernel, which compiles for TPUs only; for the GPU "
            f"target {target!r} use attention=cudnn or blockwise (e.g. --set attention=cudnn)"
        )
    from tierax.models.moe import require_moe_runs

    require_moe_runs(cfg, target, platform)
    require_quantization_runs(cfg, target)
    if cfg.quantization == "fp8" and "fp8" not in hardware.get_target(target).peak_flops:
        # Said, not silent: the target's table has no fp8 GEMM rate.
        print(
            f"note: quantization=fp8 on {target} ({platform}): the fp8 numerics run emulated "
            "(fp8-rounded operands, GEMMs at the compute dtype's rate), not as fp8 GEMMs",
            file=sys.stderr,
        )
    return for_platform(cfg, platform)


def load_plans(text: str, cfg, option: str, preset: str | None = None) -> list:
    """A comma-separated list of presets or plan files, each validated against ``cfg`` (and, with
    ``preset``, against the XLA preset they will run under)."""
    from tierax import plan as plan_lib
    from tierax.interop import files

    plans = [files.load_plan(p.strip(), cfg) for p in text.split(",") if p.strip()]
    for p in plans if preset else []:
        plan_lib.check_mechanism_preset(p, preset, f"{option} {p.name}")
    if not plans:
        raise TieraxError(
            f"{option} is empty; give a preset, a plan YAML file, or a comma-separated list of them"
        )
    return plans


@contextlib.contextmanager
def progress(title: str, total: int, *, disable: bool = False) -> Iterator:
    """A transient rich progress bar; yields ``advance(description, n)``."""
    from rich.progress import Progress

    with Progress(transient=True, disable=disable) as prog:
        task = prog.add_task(title, total=total)
        yield lambda what, n: prog.update(task, advance=n, description=what)


@contextlib.contextmanager
def prepare_progress(console, total_bytes: int | None) -> Iterator:
    """A transient rich bar for ``tierax data prepare``: input bytes read, tokens written, tokens/s.

    Yields ``advance(nbytes, ntokens)``; ``total_bytes`` None (compressed or Parquet inputs):
    a bar without a total.
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("tokenizing"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[tokens]} tokens · {task.fields[rate]} tokens/s"),
        TimeElapsedColumn(),
    )
    with Progress(
        *columns, console=console, transient=True, disable=not console.is_terminal
    ) as prog:
        task = prog.add_task("prepare", total=total_bytes, tokens="0", rate="-")
        t0, done = time.perf_counter(), [0]

        def advance(nbytes: int, ntokens: int) -> None:
            done[0] += ntokens
            dt = time.perf_counter() - t0
            rate = f"{done[0] / dt:,.0f}" if dt > 0 else "-"
            prog.update(task, advance=nbytes, tokens=f"{done[0]:,}", rate=rate)

        yield advance


def carried(spec: str | None) -> dict:
    """What a plan file says it was planned for: ``mesh`` (a MeshShape), ``microbatch`` and
    ``grad_accum``, only those it carries (``tierax plan --mesh auto --out FILE`` writes all three;
    MaxText overrides carry theirs as ``ici_*``/``dcn_*``, ``per_device_batch_size`` and
    ``gradient_accumulation_steps``); {} for a preset or something that is no plan (its verb's
    loader says why later)."""
    import pathlib

    import yaml

    from tierax.interop import maxtext_keys
    from tierax.mesh import MeshShape
    from tierax.plan import Plan

    if not spec or not pathlib.Path(spec).is_file():
        return {}
    try:
        data = yaml.safe_load(pathlib.Path(spec).read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        return {}
    if maxtext_keys.is_override_file(data):
        found = maxtext_keys.planned_for(data, f"MaxText overrides {spec!r}")
    elif isinstance(data, dict) and "groups" in data:
        plan = Plan.from_dict(data, source=f"plan file {spec!r}")
        found = {"mesh": plan.mesh, "microbatch": plan.microbatch, "grad_accum": plan.grad_accum}
    else:
        return {}
    if found.get("mesh") is not None:
        found["mesh"] = MeshShape(**found["mesh"])
    return {k: v for k, v in found.items() if v is not None}


def carried_mesh(spec: str | None):
    """The mesh a plan file carries (see :func:`carried`), or None."""
    return carried(spec).get("mesh")


MAKE_ONE = (
    "make one with `tierax plan --model MODEL --target TARGET --devices N --mesh auto --out "
    "PLAN.yaml` and pass it as the plan"
)


def mesh_option(args, plans: Sequence[str | None] = (), *, required: bool = True):
    """The mesh of a verb that runs or models a step: ``--mesh``/``--devices``, or the mesh the plan
    files carry.  ``--mesh auto`` means the plan's mesh (refused without one); a ``--mesh`` that
    differs from a plan's is refused.  ``required=False``: None when neither gives one.

    Raises:
      TieraxError: naming the conflict and the fix.
    """
    from tierax.mesh import parse_mesh

    text, devices = args.mesh, args.devices
    carried = {str(m): m for m in (carried_mesh(p) for p in plans) if m is not None}
    if len(carried) > 1:
        raise TieraxError(
            f"the plans carry different meshes ({' and '.join(carried)}); give plans planned for "
            "one mesh"
        )
    mesh = next(iter(carried.values()), None)
    if text == "auto" and mesh is None:
        raise TieraxError(
            "--mesh auto takes the mesh a plan file carries, and "
            + ("no plan was given" if not any(plans) else "the plan carries none")
            + f"; {MAKE_ONE}"
        )
    if mesh is not None and text not in (None, "auto"):
        given = parse_mesh(text, devices)
        if given != mesh:
            raise TieraxError(
                f"--mesh {given} differs from the mesh the plan was planned for ({mesh}); drop "
                "--mesh (the plan's is used) or plan again for this mesh"
            )
    _carried_microbatch(args, plans, mesh)
    if mesh is not None:
        if devices is not None and devices != mesh.size:
            raise TieraxError(
                f"--devices {devices} but the plan was planned for mesh {mesh} = {mesh.size} "
                "devices; drop --devices or plan again for this device count"
            )
        return mesh
    if not required and not text and devices is None:
        return None
    return parse_mesh(text, devices)


def note_local_fp8(cfg, what: str) -> None:
    """Say, on stderr, that ``quantization: fp8`` / ``mxfp8`` runs emulated on a local backend
    without fp8 GEMMs (anything but a GPU): never silently.  ``mxfp8`` on a local GPU older than
    Blackwell is refused (XLA would not run it as block-scaled GEMMs)."""
    quant = getattr(cfg, "quantization", "")
    if quant not in ("fp8", "mxfp8"):
        return
    import jax

    backend = jax.default_backend()
    if quant == "mxfp8":
        if backend == "gpu":
            from tierax.models.config import MXFP8_MIN_CAPABILITY

            cc = tuple(int(p) for p in jax.devices()[0].compute_capability.split("."))
            if cc < MXFP8_MIN_CAPABILITY:
                need = ".".join(map(str, MXFP8_MIN_CAPABILITY))
                raise TieraxError(
                    f"{what}: quantization=mxfp8 needs a Blackwell GPU (compute capability "
                    f"{need}+); this GPU is {'.'.join(map(str, cc))}: use --set "
                    "quantization=fp8 (per-tensor delayed scaling, its fp8 GEMMs) here"
                )
            return
        print(
            f"note: {what}: quantization=mxfp8 on the {backend} backend runs MXFP8's numerics "
            "emulated (block-quantized e4m3 operands with e8m0 scales, dequantized and multiplied "
            "in float32), not as block-scaled GEMMs: times are not MXFP8 times",
            file=sys.stderr,
        )
        return
    if backend != "gpu":
        print(
            f"note: {what}: quantization=fp8 on the {backend} backend runs the fp8 numerics "
            "emulated (fp8-rounded operands, float32 accumulation), not as fp8 GEMMs: times are "
            "not fp8 times",
            file=sys.stderr,
        )


def _carried_microbatch(args, plans: Sequence[str | None], mesh) -> None:
    """``args.microbatch`` from the plans' microbatch when --microbatch was not given; a given one
    that differs is refused.  A verb whose --microbatch is the whole batch (verify, profile) gets
    the plan's per-device microbatch × the mesh's batch axes.  A plan planned with gradient
    accumulation: a verb with ``--grad-accum`` takes it when the option is not given (a given one
    that differs is refused); one without models one microstep, said on stderr."""
    if not hasattr(args, "microbatch"):
        return
    found = [(p, carried(p)) for p in plans]
    micro = {c["microbatch"] for _, c in found if "microbatch" in c}
    if len(micro) > 1:
        raise TieraxError(
            f"the plans carry different microbatches ({', '.join(map(str, sorted(micro)))}); give "
            "plans planned for one microbatch"
        )
    if not micro:
        return
    (planned,) = micro
    per_device = getattr(args, "microbatch_per_device", True)
    if not per_device and mesh is not None:
        planned *= mesh.batch_ways  # --microbatch is the sequences of the whole batch here
    given = getattr(args, "microbatch_given", args.microbatch is not None)
    if given and args.microbatch != planned:
        raise TieraxError(
            f"--microbatch {args.microbatch} differs from the microbatch the plan was planned for "
            f"({planned} sequences{' per device' if per_device else ' in the batch'}); drop "
            "--microbatch (the plan's is used) or plan again for this microbatch"
        )
    args.microbatch = planned
    accum = max((c.get("grad_accum", 1) for _, c in found), default=1)
    if hasattr(args, "grad_accum"):
        if args.grad_accum is not None and accum > 1 and args.grad_accum != accum:
            raise TieraxError(
                f"--grad-accum {args.grad_accum} differs from the {accum} accumulated microsteps "
                "the plan was planned for; drop --grad-accum (the plan's is used) or plan again"
            )
        if args.grad_accum is None and accum > 1:
            args.grad_accum = accum
        return
    if accum > 1 and not getattr(args, "emit", None):  # --emit writes the accumulation
        print(
            f"note: the plan was planned for {accum} accumulated microsteps of microbatch "
            f"{planned}; this models one microstep",
            file=sys.stderr,
        )
