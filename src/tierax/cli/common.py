"""What every verb shares: the console, model and plan options, checked sizes, progress."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import pathlib
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


class Given(argparse.Action):
    """Store the value and record that it was given (``args.<dest>_given``): a default and an
    explicit value equal to it are told apart (a plan file's value replaces a default only)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._given = self.dest + "_given"

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, self._given, True)


def add_size_args(
    parser: argparse.ArgumentParser, *, microbatch: int, seq: int = 64, per_device: bool = True
) -> None:
    what = "sequences per device" if per_device else "sequences in the batch"
    parser.add_argument(
        "--microbatch",
        type=positive_int,
        default=microbatch,
        action=Given,
        help=f"{what} (default {microbatch}, or the microbatch a plan file records)",
    )
    parser.set_defaults(microbatch_given=False, seq_given=False, microbatch_per_device=per_device)
    parser.add_argument(
        "--seq",
        type=positive_int,
        default=seq,
        action=Given,
        help=f"sequence length (default {seq}, or the seq a plan file records)",
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

    plans = []
    for spec in (p.strip() for p in text.split(",") if p.strip()):
        plan = files.load_plan(spec, cfg)
        if spec not in plan_lib.PRESETS and plan.name in plan_lib.PRESETS:
            # a file named after a preset (`plans --show minimal --yaml`, edited or not): its rows
            # must not read as the preset's
            plan = dataclasses.replace(plan, name=f"{plan.name} (file {spec})")
        plans.append(plan)
    for p in plans if preset else []:
        plan_lib.check_mechanism_preset(p, preset, f"{option} {p.name}")
    if not plans:
        raise TieraxError(
            f"{option} is empty; give a preset, a plan YAML file, or a comma-separated list of them"
        )
    return plans


def read_target_config(path: str | None) -> str | None:
    """``--target-config FILE``'s text (a GpuTargetConfigProto); None where it was not given."""
    if path is None:
        return None
    p = pathlib.Path(path)
    if not p.is_file():
        raise TieraxError(f"--target-config {path!r}: no such file")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TieraxError(
            f"--target-config {path!r} is not UTF-8 text; give a GpuTargetConfigProto text file"
        ) from None


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


def carried_mesh(spec: str | None):
    """The mesh a plan file records it was planned for, or None."""
    from tierax.interop.files import read_planned_for
    from tierax.mesh import MeshShape

    record = read_planned_for(spec)
    return MeshShape(**record.mesh) if record is not None and record.mesh is not None else None


def model_identity(args) -> str | None:
    """The ``model`` a plan records for the model options of ``args``: the named config with its
    ``--set`` overrides, or the digest of a ``--model-config`` file's bytes; None when the file
    cannot be read (:func:`resolve_model` says why)."""
    import pathlib

    from tierax.plan.planned_for import model_digest, model_name

    if args.model_config is not None:
        try:
            return model_digest(pathlib.Path(args.model_config).read_bytes())
        except OSError:
            return None
    return model_name(args.model or args.model_default or "", args.overrides)


MAKE_ONE = (
    "make one with `tierax plan --model MODEL --target TARGET --devices N --mesh auto --out "
    "PLAN.yaml` and pass it as the plan"
)
# Units a verb's flag counts in, for messages.
_UNITS = {"microbatch": " sequences per device", "seq": " tokens"}


def _given(args, key: str) -> bool:
    """Whether the option of ``key`` was given: recorded by :class:`Given`, else not None."""
    flag = getattr(args, f"{key}_given", None)
    return flag if flag is not None else getattr(args, key, None) is not None


def mesh_option(args, plans: Sequence[str | None] = (), *, required: bool = True, defaults=None):
    """Merge what the plan files record they were planned for with the verb's flags
    (:func:`tierax.plan.merge_planned_for`): ``args``' model, target, microbatch, seq,
    grad_accum and schedule (those the verb has) are set to the merged values, notes go to
    stderr, and the mesh is returned.  ``--mesh auto`` means the plan's mesh (refused without
    one).  ``required=False``: None when no mesh is given or recorded; ``defaults``: values of
    keys the verb's options leave None (``plans --emit``).

    Raises:
      TieraxError: a flag differs from the plan's record, the plans disagree, or no mesh.
    """
    from tierax.interop.files import read_planned_for
    from tierax.mesh import MeshShape, parse_mesh
    from tierax.plan import merge_planned_for
    from tierax.plan import planned_for as pf

    found = [(p, r) for p in plans if p for r in [read_planned_for(p)] if r is not None]
    record = pf.common(found)
    name = ", ".join(p for p, _ in found) or None
    text, devices = getattr(args, "mesh", None), getattr(args, "devices", None)
    if text == "auto" and record.mesh is None:
        raise TieraxError(
            "--mesh auto takes the mesh a plan file carries, and "
            + ("no plan was given" if not any(plans) else "the plan carries none")
            + f"; {MAKE_ONE}"
        )
    if record.mesh is not None and text in (None, "auto") and devices is not None:
        planned = MeshShape(**record.mesh)
        if devices != planned.size:
            raise TieraxError(
                f"--devices {devices} differs from the {planned.size} devices of the mesh plan "
                f"{name} was planned for ({planned}); drop --devices or plan again for "
                f"--devices {devices}"
            )
    given_mesh = None
    if text not in (None, "auto"):
        given_mesh = parse_mesh(text, devices)
    elif devices is not None and record.mesh is None:
        given_mesh = parse_mesh(None, devices)
    defaults = dict(defaults or {})
    keys = [k for k in ("target", "schedule") if hasattr(args, k)]
    given = {k: getattr(args, k) if _given(args, k) else None for k in keys}
    given["model"] = _given_model(args, record)
    default = {k: getattr(args, k) for k in keys} | {"model": args.model_default} | defaults
    if required or record.mesh is not None or given_mesh is not None:
        given["mesh"], default["mesh"] = given_mesh, parse_mesh(None, None)
    values, notes = merge_planned_for(record, given, default, plan=name)
    mesh = MeshShape(**pf.checked_mesh(values["mesh"], "mesh")) if values.get("mesh") else None
    sizes = [k for k in ("microbatch", "seq", "grad_accum") if hasattr(args, k)]
    if sizes:
        per_device = getattr(args, "microbatch_per_device", True)
        view = record
        if not per_device and record.microbatch is not None and mesh is not None:
            view = record.replace(microbatch=record.microbatch * mesh.batch_ways)
        units = dict(_UNITS)
        if not per_device:
            units["microbatch"] = " sequences in the batch"
        more, more_notes = merge_planned_for(
            view,
            {k: getattr(args, k) if _given(args, k) else None for k in sizes},
            {k: getattr(args, k) for k in sizes} | {"grad_accum": 1} | defaults,
            plan=name,
            units=units,
        )
        values |= more
        notes += more_notes
    for key in (*keys, *sizes):
        setattr(args, key, values[key])
    _apply_model(args, values["model"], name)
    if not hasattr(args, "grad_accum") and (record.grad_accum or 1) > 1:
        notes.append(
            f"note: the plan was planned for {record.grad_accum} accumulated microsteps of "
            f"microbatch {record.microbatch}; this models one microstep"
        )
    for line in notes:
        print(line, file=sys.stderr)
    return mesh


def plan_model_option(args, plan: str) -> None:
    """Merge the model ``plan`` records with ``args``' model options (a display of the plan, which
    needs nothing else it was planned for): the plan's model where the options name none, a
    differing one refused, a note on stderr where the file records none."""
    from tierax.interop.files import read_planned_for
    from tierax.plan import PlannedFor, merge_planned_for

    record = read_planned_for(plan) or PlannedFor()
    values, notes = merge_planned_for(
        record, {"model": _given_model(args, record)}, {"model": args.model_default}, plan=plan
    )
    for line in notes:
        print(line, file=sys.stderr)
    _apply_model(args, values["model"], plan)


def _given_model(args, record) -> str | None:
    """The model the options name (None: none named).  ``--set`` alone applies to the model the
    plan records, else to the verb's default model."""
    from tierax.plan import planned_for as pf

    if args.model is None and args.model_config is None:
        if not args.overrides:
            return None
        base = record.model or args.model_default or ""
        if base.startswith(pf.DIGEST_PREFIX):
            return model_identity(args)
        name, sets = pf.parse_model_name(base)
        return pf.model_name(name, [*sets, *args.overrides])
    return model_identity(args)


def _apply_model(args, model: str | None, plan: str | None) -> None:
    """Select the merged model (the plan's, when the options name none; with ``--set`` alone, the
    plan's with those overrides added)."""
    from tierax.plan import planned_for as pf

    if model is None or model == model_identity(args):
        return
    if model.startswith(pf.DIGEST_PREFIX):
        raise TieraxError(
            f"plan {plan} was planned for a model config file ({model}); give that file with "
            "--model-config FILE"
        )
    args.model, args.overrides = pf.parse_model_name(model)


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
