"""``tierax compile --maxtext CONFIG.yml [key=value ...]``: MaxText's own train step compiled for a
target without it (:mod:`tierax.xla.maxtext_step`), over the compile verb's flags."""

from __future__ import annotations

import contextlib
import json
import math
import sys

from tierax.cli import maxtext_program
from tierax.errors import TieraxError


def check_args(args) -> None:
    """Refuse what does not go with ``compile --maxtext``, before any work.

    Raises:
      TieraxError: naming the option and what to do instead.
    """
    why = (
        "compile --maxtext compiles MaxText's own step as its config says (its remat_policy and "
        "tensor keys, given as key=value after --maxtext FILE, or --plan); "
        "--model/--model-config/--rates are for tierax's own step"
    )
    if not maxtext_program.check_maxtext(args, why, {"--rates": getattr(args, "rates", None)}):
        return
    if getattr(args, "plan_given", False):
        from tierax.interop.maxtext_program import given_plan

        given_plan.check(args.plan, args.maxtext_overrides)
    if args.xla_preset != "none":
        raise TieraxError(
            f"--xla-preset {args.xla_preset} sets tierax's XLA flags; MaxText's step takes its "
            "flags from XLA_FLAGS / LIBTPU_INIT_ARGS and its compile_xla_flags key: leave "
            "--xla-preset out"
        )
    if args.mesh == "auto":
        raise TieraxError(maxtext_program.MESH_AUTO)


def cmd_compile(args) -> int:
    """``tierax compile --maxtext``."""
    check_args(args)
    from tierax import hardware, launch
    from tierax.cli.common import console, read_target_config
    from tierax.interop.maxtext_program.config import require_maxtext
    from tierax.mesh import parse_mesh

    spec = hardware.compile_target(args.target)
    mesh = None
    if args.mesh is not None:
        mesh = parse_mesh(args.mesh, args.devices).to_dict()
    devices = args.devices or (math.prod(mesh.values()) if mesh else 1)
    target_config = read_target_config(args.target_config)
    if spec.kind == "tpu" and target_config is not None:
        raise TieraxError("--target-config is a GpuTargetConfigProto; a TPU target takes none")
    # What MaxText prints (at its import, while it builds and compiles its step) goes to stderr:
    # stdout holds the result only (--json's JSON, or the table).
    with contextlib.redirect_stdout(sys.stderr):
        require_maxtext()
        modelled = program_flags(args)
        launch.start_maxtext_compile(args.target, devices, modelled)
        from tierax.xla import compile as compile_lib
        from tierax.xla.maxtext_step import compile_program

        if spec.kind == "tpu":
            compile_lib.check_tpu_aot()
        else:
            compile_lib.check_gpu_aot()
        overrides = list(args.maxtext_overrides)
        if getattr(args, "plan_given", False):
            overrides = _with_plan(args, devices, mesh)
        result, _ = compile_program(
            args.maxtext,
            overrides,
            target=args.target,
            devices=devices,
            mesh=mesh,
            target_config=target_config,
            **_sizes(args),
        )
    from tierax.report.tables import compile_table

    if getattr(args, "plan_given", False):
        import dataclasses

        result = dataclasses.replace(result, plan=f"--plan {args.plan} ({result.plan})")
    line = flags_line(result.xla_environment, modelled, args.target)
    if args.json:
        print(json.dumps(result.to_json() | {"modelled_flags": modelled}, indent=2))
        print(line, file=sys.stderr)
    else:
        console().print(compile_table(result))
        print(line)
    return 0


def program_flags(args) -> dict[str, str]:
    """The flags ``compile --maxtext`` adds for its compile: those ``simulate``/``plan --maxtext``
    model the program under (:func:`tierax.interop.maxtext.modelled_flags`, schedule lhs), none with
    ``--maxtext-flags-only`` (the program MaxText's ``train_compile`` alone compiles)."""
    if getattr(args, "maxtext_flags_only", False):
        return {}
    from tierax.interop import maxtext as maxtext_interop

    return maxtext_interop.modelled_flags(args.target)


def flags_line(compiled: dict, modelled: dict, target: str) -> str:
    """What the compile ran with (``compiled``: its flag variable, MaxText's ``train_compile``'s
    own libtpu options, ``modelled`` and the user's environment together) and whether that holds
    the flags simulate/plan --maxtext model on ``target``."""
    from tierax import hardware
    from tierax.interop import maxtext as maxtext_interop

    var = "LIBTPU_INIT_ARGS" if hardware.get_target(target).kind == "tpu" else "XLA_FLAGS"
    value = compiled.get(var, "")
    text = f"compiled with {var}={value!r}" if value else f"compiled with no {var}"
    model = maxtext_interop.flags_text(maxtext_interop.modelled_flags(target))
    if not modelled:
        return (
            f"{text} (--maxtext-flags-only: not the flags simulate/plan --maxtext model: {model})"
        )
    missing = [f for v in modelled.values() for f in v.split() if f not in value.split()]
    if missing:
        return (
            f"{text}: NOT the program simulate/plan --maxtext model ({model}): your environment "
            f"sets {', '.join(missing)} otherwise"
        )
    return f"{text}: the flags simulate/plan --maxtext model ({model}) included"


def _with_plan(args, devices: int, mesh) -> list[str]:
    """The user's overrides with ``--plan``'s MaxText keys joined
    (:mod:`tierax.interop.maxtext_program.given_plan`): the program is traced first for the names
    and layer stacks the plan is resolved against (JAX started for the compile)."""
    from tierax.interop.maxtext_program import given_plan, program

    with contextlib.redirect_stdout(sys.stderr):
        run = program(
            args.maxtext,
            args.maxtext_overrides,
            target=args.target,
            devices=devices,
            mesh=mesh,
            **_sizes(args),
        )
    keys, notes = given_plan.plan_keys(args.plan, run)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return given_plan.joined(args.maxtext_overrides, keys, args.plan)


def _sizes(args) -> dict:
    """The sizing flags given (None: the config's value): --microbatch, --seq, --grad-accum."""
    return dict(
        microbatch=args.microbatch if getattr(args, "microbatch_given", False) else None,
        seq=args.seq if getattr(args, "seq_given", False) else None,
        grad_accum=args.grad_accum,
    )
