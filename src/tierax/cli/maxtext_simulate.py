"""``tierax simulate --maxtext CONFIG.yml [key=value ...]`` and ``tierax plan --maxtext ...``:
MaxText's own program (:func:`tierax.interop.maxtext_program.program`) priced and planned by
tierax's step model, over those verbs' flags.

``simulate --maxtext`` prices the program under MaxText's own ``remat_policy`` (the config's, or a
``remat_policy=...`` and its tensor keys given as key=value): ``--plan`` is refused, since the
config's policy is the plan, as ``compile --maxtext`` compiles it.  ``plan --maxtext`` plans one
placement per name (what MaxText's ``custom`` policy expresses) under XLA's offload policy, the
training state on device (MaxText offloads its optimizer state all or none), and with ``--emit
maxtext`` writes the MaxText keys of the plan (:mod:`tierax.interop.maxtext_program.emit`).
"""

from __future__ import annotations

import json
import sys

from tierax.errors import TieraxError

GIB = 2**30


def _common_refusals(args, verb: str) -> None:
    given = [
        flag
        for flag, value in (
            ("--model", args.model),
            ("--model-config", args.model_config),
            ("--set", args.overrides or None),
            ("--rates", getattr(args, "rates", None)),
        )
        if value is not None
    ]
    if given:
        raise TieraxError(
            f"--maxtext and {' and '.join(given)} both given: {verb} --maxtext prices MaxText's "
            "own program (its keys go after --maxtext FILE as key=value); --model/--model-config/"
            "--set/--rates are for tierax's own models"
        )
    if args.mesh == "auto":
        raise TieraxError(
            f"{verb} --maxtext takes the mesh from MaxText's ici_*/dcn_* keys or --mesh "
            "AXIS=N,...; --mesh auto (a mesh search) is not offered for MaxText's program"
        )
    if args.target == "cpu":
        raise TieraxError(
            f"--target cpu: {verb} --maxtext prices MaxText's program on a TPU or GPU target "
            "(v5e, v5p, v6e, v7x, h100, h200, b200, gb200)"
        )


def check_simulate(args) -> bool:
    """Whether ``simulate`` prices MaxText's program; what does not go with ``--maxtext`` is
    refused before any work.

    Raises:
      TieraxError: naming the option and what to do instead.
    """
    if args.maxtext is None:
        _no_overrides(args)
        return False
    _common_refusals(args, "simulate")
    if getattr(args, "plan_given", False):
        raise TieraxError(
            f"--plan {args.plan} with --maxtext: the plan of MaxText's program is its own "
            "remat_policy; give it after --maxtext FILE as key=value (e.g. remat_policy=full, or "
            "remat_policy=custom query_proj=offload ...), as MaxText's command line takes it"
        )
    return True


PLAN_REFUSED = {
    "sweep": "--sweep",
    "check": "--check (compile the emitted keys with tierax compile --maxtext)",
    "segments": "--segments (MaxText sets each name once for every layer)",
    "max_microbatch": "--max-microbatch",
    "state_on_device": None,  # accepted: the state stays on device anyway
}


def check_plan(args) -> bool:
    """Whether ``plan`` plans MaxText's program; what does not go with ``--maxtext`` is refused
    before any work.

    Raises:
      TieraxError: naming the option and what to do instead.
    """
    if args.maxtext is None:
        _no_overrides(args)
        return False
    _common_refusals(args, "plan")
    refused = [what for key, what in PLAN_REFUSED.items() if what and getattr(args, key, None)]
    if getattr(args, "global_batch", None) or getattr(args, "top", None):
        refused.append("--global-batch/--top (mesh search options)")
    if refused:
        raise TieraxError(
            f"{', '.join(refused)} not offered with plan --maxtext yet; plan --maxtext plans "
            "MaxText's program at its own batch and mesh"
        )
    for option, value in (("--for", args.for_tool), ("--emit", args.emit)):
        if value not in (None, "maxtext"):
            raise TieraxError(f"{option} {value!r} with --maxtext: only maxtext")
    if args.schedule not in ("serial", "lhs", "lhs-pipelined"):
        raise TieraxError(
            f"unknown schedule {args.schedule!r}; choose one of: serial, lhs, lhs-pipelined"
        )
    return True


def _no_overrides(args) -> None:
    if getattr(args, "maxtext_overrides", None):
        raise TieraxError(
            f"MaxText overrides {' '.join(args.maxtext_overrides)} are given without --maxtext; "
            "give --maxtext CONFIG.yml before them (tierax's own models take --set KEY=VALUE)"
        )


def _program(args):
    """MaxText's program the options ask for; what MaxText prints goes to stderr (stdout carries
    tierax's output)."""
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):
        return _traced(args)


def _traced(args):
    from tierax.interop import maxtext_program
    from tierax.mesh import parse_mesh

    mesh = parse_mesh(args.mesh, args.devices).to_dict() if args.mesh is not None else None
    maxtext_program.require_maxtext()
    from tierax import launch

    launch.start()
    return maxtext_program.program(
        args.maxtext,
        args.maxtext_overrides,
        target=args.target,
        devices=args.devices,
        mesh=mesh,
        microbatch=args.microbatch if getattr(args, "microbatch_given", False) else None,
        seq=args.seq if getattr(args, "seq_given", False) else None,
        grad_accum=args.grad_accum,
    )


def _rates(args, run):
    from tierax import costmodel as cm
    from tierax.solving.whatif import override_rates

    return override_rates(cm.target_rates(args.target, run.program.dtype), args.rate)


def _title(args, run, microbatch: int, extra: str) -> str:
    p = run.program
    return (
        f"MaxText {p.name} · {args.target} · mesh "
        + ",".join(f"{a}={n}" for a, n in run.mesh.items() if n > 1)
        + f" · microbatch {microbatch}/device × seq {p.seq} · {extra}"
    )


def cmd_simulate(args) -> int:
    """``tierax simulate``: MaxText's program with ``--maxtext``, else tierax's model."""
    if not check_simulate(args):
        from tierax.cli import planning

        return planning.cmd_simulate(args)
    from tierax import costmodel as cm
    from tierax.cli.common import console
    from tierax.report.tables import prediction_table

    run = _program(args)
    rates = _rates(args, run)
    pred = cm.simulate(run.plan, run.program, rates, args.schedule, run.grad_accum)
    for note in run.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        doc = pred.to_json() | {
            "maxtext": {
                "remat_policy": run.remat_policy,
                "attention": run.attention,
                "traced_attention": run.traced_attention,
                "mesh": run.mesh,
                "grad_accum": run.grad_accum,
                "plan": run.plan.to_dict(),
                "notes": list(run.notes),
            }
        }
        print(json.dumps(doc, indent=2))
        return 0
    console().print(
        prediction_table(
            pred,
            _title(args, run, run.program.microbatch, f"remat_policy {run.remat_policy}"),
        )
    )
    return 0


def cmd_plan(args) -> int:
    """``tierax plan``: MaxText's program with ``--maxtext``, else tierax's model."""
    if not check_plan(args):
        from tierax.cli import planning

        return planning.cmd_plan(args)
    from tierax import hardware
    from tierax.cli.common import console
    from tierax.cli.planning import _plan_out
    from tierax.fileio import write_text_atomic
    from tierax.interop import maxtext as maxtext_interop
    from tierax.interop.maxtext_program import emit
    from tierax.report.tables import explain_table, prediction_table
    from tierax.solving import planning
    from tierax.solving.planning import check_budget, check_host_budget

    out = _plan_out(args)
    hardware.get_target(args.target)
    run = _program(args)
    rates = _rates(args, run)
    budget = args.budget_gib and args.budget_gib * GIB
    host_budget = args.host_budget_gib and args.host_budget_gib * GIB
    check_budget(budget, rates, option="--budget-gib", unit=GIB)
    check_host_budget(host_budget, rates, option="--host-budget-gib", unit=GIB)
    req = planning.Request(
        None,
        run.mesh,
        rates,
        microbatch=run.program.microbatch,
        seq=run.program.seq,
        schedule=args.schedule,
        budget_bytes=budget,
        host_budget_bytes=host_budget,
        for_tool="maxtext",
        place_state=False,
        grad_accum=run.grad_accum,
        program=run.program,
        model=run.program.name,
        # MaxText's own keys (its optimizer state is not planned here: no --state-on-device hint)
        remedies="Use a smaller per_device_batch_size or max_target_length (key=value after the "
        "config), more devices, or a larger device budget",
    )
    result, notes = planning.solve(req)
    notes = [*run.notes, *notes, "training state on device (MaxText offloads all of its "
             "optimizer state or none; not planned here)"]  # fmt: skip
    if args.emit:
        import math

        devices = math.prod(run.mesh.values())
        env, why = maxtext_interop.runtime_env(
            target=args.target,
            schedule=args.schedule,
            devices=devices,
            budget_bytes=result.budget_bytes,
            capacity_bytes=result.predicted.device_capacity_bytes,
            host_bytes=result.predicted.host_bytes,
        )
        text = emit.overrides_yaml(
            result.plan,
            run,
            path=args.maxtext,
            user=args.maxtext_overrides,
            microbatch=result.microbatch,
            seq=run.program.seq,
            grad_accum=run.grad_accum,
            target=args.target,
            schedule=args.schedule,
            predicted_peak=result.predicted.peak_device_bytes,
            budget_bytes=result.budget_bytes,
            host_bytes=result.predicted.host_bytes,
            env=env,
            why=why,
            notes=notes,
        )
    else:
        text = result.plan.to_yaml()
    if out:
        write_text_atomic(out, text)
    stream = sys.stderr if args.json or (args.emit and not out) else sys.stdout
    for line in notes:
        print(line, file=stream)
    if args.json or (args.emit and not out):
        print(
            json.dumps({**result.to_json(), "notes": notes}, indent=2) if args.json else text,
            end="" if not args.json else "\n",
        )
        return 0
    title = _title(args, run, result.microbatch, args.schedule)
    console().print(explain_table(result, title))
    console().print(prediction_table(result.predicted, "predicted step"))
    if out:
        print(f"wrote {out}")
    return 0
