"""Verbs that read configs and model a step without running it: models, plans, inventory, simulate,
plan, calibrate."""

from __future__ import annotations

import dataclasses
import json
import sys

from tierax import launch
from tierax.cli.common import (
    console,
    mesh_option,
    model_identity,
    plan_model_option,
    resolve_model,
)
from tierax.errors import TieraxError
from tierax.mesh import parse_mesh

GIB = 2**30
CHECK_ITERATIONS = 4  # plan --check's default bound on compiles
TOP = 5  # plan --mesh auto's default table size
MAX_MICROBATCH_CHECK_ITERATIONS = 5  # plan --max-microbatch --check's
# The options of `tierax plan` whose combinations tierax.solving.planning.check_options checks.
PLAN_OPTIONS = (
    "sweep",
    "check",
    "check_iterations",
    "segments",
    "for_tool",
    "emit",
    "max_microbatch",
    "out",
    "json",
    "mesh",
    "devices",
    "global_batch",
    "top",
    "grad_accum",
    "microbatch_given",
)


def cmd_models(args) -> int:
    from tierax.models import (
        NAMED_CONFIGS,
        apply_overrides,
        config_to_dict,
        config_to_yaml,
        get_config,
    )
    from tierax.report.tables import models_table

    if args.action == "show":
        if args.name is None:
            raise TieraxError(
                f"models show needs a NAME; named configs: {', '.join(NAMED_CONFIGS)}"
            )
        cfg = apply_overrides(get_config(args.name), args.overrides)
        print(
            json.dumps(config_to_dict(cfg), indent=2) if args.json else config_to_yaml(cfg),
            end="\n" if args.json else "",
        )
        return 0
    if args.name is not None or args.overrides:
        raise TieraxError(
            "a NAME and --set apply only to `tierax models show NAME [--set KEY=VALUE ...]`"
        )
    if args.json:
        print(
            json.dumps(
                {
                    n: {
                        "family": c.family,
                        "param_count": c.param_count(),
                        "activated_param_count": c.activated_param_count(),
                    }
                    for n, c in NAMED_CONFIGS.items()
                },
                indent=2,
            )
        )
    else:
        console().print(models_table(NAMED_CONFIGS.values()))
    return 0


# `plans --emit`'s sizes when not given (options given without --emit are refused).
SHOW_DEFAULTS = {"target": "h200", "schedule": "lhs", "microbatch": 8, "seq": 64}


def cmd_plans(args) -> int:
    from tierax import plan as plan_lib
    from tierax.interop import files
    from tierax.report.tables import plan_table
    from tierax.solving import for_maxtext as interop

    sizing = {
        "--target": args.target,
        "--devices": args.devices,
        "--mesh": args.mesh,
        "--schedule": args.schedule,
        "--microbatch": args.microbatch,
        "--seq": args.seq,
        "--grad-accum": args.grad_accum,
    }
    interop.check_show_options(show=args.show, yaml=args.yaml, emit=args.emit, sizing=sizing)
    if args.emit:  # what the plan records, merged with the flags (the plan's target, model, sizes)
        mesh = mesh_option(args, [args.show], defaults=SHOW_DEFAULTS | {"grad_accum": 1})
    elif args.show:  # the plan's model where no option names one
        plan_model_option(args, args.show)
    cfg = resolve_model(args, target=args.target)  # what the target cannot run is refused
    if args.show is None:
        for name, (desc, _) in plan_lib.PRESETS.items():
            print(f"{name:18s} {desc}")
        return 0
    if args.emit:  # a plan file of a model's own names: MaxText's refusal names them first
        from tierax.interop import maxtext

        maxtext.check_maxtext_names(args.show)
    plan = files.load_plan(args.show, cfg)
    if args.emit:
        sizes = {k: getattr(args, k) for k in SHOW_DEFAULTS}
        print(
            interop.emit_plan(
                plan, cfg, args.emit, mesh=mesh.to_dict(), grad_accum=args.grad_accum, **sizes
            ),
            end="",
        )
    elif args.yaml:
        print(plan.to_yaml(), end="")
    else:
        console().print(plan_table(plan_lib.resolve(plan, cfg), f"plan {plan.name} on {cfg.name}"))
    return 0


def _inputs(args, *, rates: bool = True, plans: tuple = ()):
    """(model, mesh, rates or None) of a planning verb, validated (the target too) before JAX
    starts; ``plans``: the plan files whose mesh ``--mesh`` defaults to."""
    from tierax import hardware

    mesh = mesh_option(args, plans)  # the plan's record merged with the flags first
    cfg = resolve_model(args, target=args.target)  # an unknown target is refused here
    if args.target != "cpu":
        hardware.get_target(args.target)
    if rates:
        from tierax.solving.whatif import override_rates

        rates = override_rates(target_rates(args, cfg), getattr(args, "rate", []))
        check_budget(args, rates)
    else:
        rates = None
    launch.start()
    return cfg, mesh, rates


def target_rates(args, cfg):
    """The target's rates, with ``--rates``' calibration applied where given.  A ``--rate`` that
    the model's step would not use (``fp8_matmul`` without fp8 GEMMs) is refused here, before any
    work: a what-if that changes nothing would read as an answer."""
    from tierax import costmodel as cm
    from tierax.costmodel import calibrated

    for item in getattr(args, "rate", None) or []:
        key = str(item).partition("=")[0].strip()
        if key == "fp8_matmul" and not getattr(cfg, "quantization", ""):
            raise TieraxError(
                f"--rate {item}: {cfg.name} runs no fp8 GEMMs (quantization is unset), so the fp8 "
                "rate changes nothing; give --set quantization=fp8 (or mxfp8) to model fp8 GEMMs, "
                "or drop this --rate"
            )

    rates = cm.target_rates(args.target, cfg.dtype)
    if getattr(args, "rates", None):
        rates = calibrated.load(args.rates).apply(rates)
    return rates


def check_budget(args, rates) -> None:
    """Refuse a ``--budget-gib`` above what the target's device offers and a ``--host-budget-gib``
    above its host memory per device."""
    from tierax.solving.planning import check_budget as check
    from tierax.solving.planning import check_host_budget

    budget = getattr(args, "budget_gib", None)
    check(budget and budget * GIB, rates, option="--budget-gib", unit=GIB)
    host = getattr(args, "host_budget_gib", None)
    check_host_budget(host and host * GIB, rates, option="--host-budget-gib", unit=GIB)


def _title(cfg, args, mesh, microbatch, extra: str = "") -> str:
    return (
        f"{cfg.name} · {args.target} · mesh {mesh} · microbatch {microbatch}/device × seq "
        f"{args.seq}" + (f" · {extra}" if extra else "")
    )


def cmd_inventory(args) -> int:
    from tierax.report.tables import inventory_table
    from tierax.tracing import inventory as inv_lib

    cfg, mesh, _ = _inputs(args, rates=False)
    inv = inv_lib.model_inventory(cfg, args.microbatch, args.seq, mesh.to_dict())
    if args.json:
        print(json.dumps(inv_lib.inventory_json(inv), indent=2))
    else:
        console().print(inventory_table(inv, cfg))
    return 0


def cmd_simulate(args) -> int:
    from tierax import costmodel as cm
    from tierax import plan as plan_lib
    from tierax.interop import files
    from tierax.report.tables import prediction_table
    from tierax.tracing.model_program import program_of

    cfg, mesh, rates = _inputs(args, plans=(args.plan,))
    plan = files.load_plan(args.plan, cfg)
    plan_lib.check_mechanism_preset(plan, args.schedule, "--plan")
    pred = cm.simulate(
        plan,
        program_of(cfg, args.microbatch, args.seq, mesh.to_dict()),
        rates,
        args.schedule,
        args.grad_accum or 1,
    )
    if args.json:
        print(json.dumps(pred.to_json(), indent=2))
    else:
        console().print(
            prediction_table(
                pred,
                _title(
                    cfg,
                    args,
                    mesh,
                    args.microbatch,
                    f"plan {plan.name} · {args.schedule}"
                    + (f" · {args.grad_accum} accumulated" if (args.grad_accum or 1) > 1 else ""),
                ),
            )
        )
    return 0


def _request(args, cfg, mesh, rates):
    """The :class:`tierax.solving.planning.Request` that ``tierax plan``'s options ask for."""
    from tierax.solving import planning

    return planning.Request(
        cfg,
        mesh.to_dict(),
        rates,
        microbatch=args.microbatch,
        seq=args.seq,
        schedule=args.schedule,
        budget_bytes=args.budget_gib and args.budget_gib * GIB,
        host_budget_bytes=args.host_budget_gib and args.host_budget_gib * GIB,
        segments=args.segments,
        max_microbatch=args.max_microbatch,
        for_tool=args.for_tool,
        place_state=not getattr(args, "state_on_device", False),
        grad_accum=args.grad_accum or 1,
        model=model_identity(args),
    )


def _largest_microbatch(request, result) -> str:
    """``plan --max-microbatch``'s answer in words where the search found where fitting stops:
    the microbatch, and where the loss in twice the tiles (the next count dividing the sequence)
    lets a larger one fit, that microbatch and the option."""
    import dataclasses

    from tierax.solving import no_fit, planner, planning

    mb = result.microbatch
    line = f"largest microbatch that fits: {mb:,} per device ({mb + 1:,} does not)"
    n = request.cfg.loss_tiles * 2
    while n <= no_fit.MAX_HINT_TILES and request.seq % n:
        n *= 2
    if n > no_fit.MAX_HINT_TILES:
        return line
    tiled = dataclasses.replace(request, cfg=dataclasses.replace(request.cfg, loss_tiles=n))
    try:
        more = planning.solve(tiled)[0].microbatch
    except planner.NoPlanFits:
        return line
    if more > mb:
        line += f"; with the loss in {n} tiles (--set loss_tiles={n}) {more:,} fits"
    return line


def _written_by_plan(path) -> bool:
    """A file ``tierax plan --out`` wrote: a MaxText overrides file it emitted, or a plan YAML."""
    from tierax import plan as plan_lib
    from tierax.interop import maxtext_keys

    text = path.read_text(encoding="utf-8")
    emitted = "# MaxText overrides written by tierax"
    if text.startswith(maxtext_keys.HEADER_NAME) and emitted in text:
        return True
    try:
        plan_lib.Plan.from_yaml(text, source=str(path))
    except TieraxError:
        return False
    return True


def _plan_out(args):
    """``--out`` of ``tierax plan``, checked before any work: an existing file is replaced only if
    an earlier ``tierax plan`` wrote it, or with ``--force``."""
    from tierax.fileio import check_replaceable_file

    if not args.out:
        return None
    return check_replaceable_file(
        args.out,
        ours=_written_by_plan,
        what="a plan or MaxText overrides file tierax wrote",
        force=args.force,
    )


def cmd_plan(args) -> int:
    from tierax.fileio import write_text_atomic
    from tierax.report.tables import explain_table, prediction_table
    from tierax.solving import for_maxtext as interop
    from tierax.solving import planning

    planning.check_options(**{k: getattr(args, k) for k in PLAN_OPTIONS})
    if not (args.for_tool or args.emit):  # MaxText moves offloads with XLA's offload policy
        from tierax import plan as plan_lib

        plan_lib.check_mechanism_preset(None, args.schedule, "--schedule")
    if args.mesh == "auto":
        return _plan_mesh_auto(args)
    if args.sweep:
        return _plan_sweep(args)
    if args.check:
        return _plan_check(args)
    out = _plan_out(args)
    cfg, mesh, rates = _inputs(args)
    request = _request(args, cfg, mesh, rates)
    result, notes = planning.solve(request)
    if args.max_microbatch and result.search_stopped_at is None:  # stopped: solve's note says so
        notes = [*notes, _largest_microbatch(request, result)]
    text = (
        interop.emit(
            result,
            cfg,
            args.emit,
            seq=args.seq,
            mesh=mesh.to_dict(),
            schedule=args.schedule,
            target=args.target,
            notes=tuple(notes),
        )
        if args.emit
        else result.plan.to_yaml()
    )
    if out:
        write_text_atomic(out, text)
    for line in notes:
        print(line, file=sys.stderr if args.json or (args.emit and not out) else sys.stdout)
    if args.json or (args.emit and not out):  # stdout carries the result: JSON, or the emitted file
        print(
            json.dumps({**result.to_json(), "notes": notes}, indent=2) if args.json else text,
            end="",
        )
        return 0
    console().print(
        explain_table(result, _title(cfg, args, mesh, result.microbatch, args.schedule))
    )
    console().print(prediction_table(result.predicted, "predicted step"))
    if out:
        print(f"wrote {out}")
    return 0


def _plan_check(args) -> int:
    """``tierax plan --check``: plan, compile deviceless for the target, correct the workspace term,
    re-plan."""
    from tierax import hardware
    from tierax.fileio import write_text_atomic
    from tierax.solving.whatif import override_rates

    out = _plan_out(args)
    spec = hardware.compile_target(args.target)  # a projection (no XLA device spec) is refused here
    cfg, mesh = resolve_model(args, target=args.target), parse_mesh(args.mesh, args.devices)
    mesh.check_model(cfg, where="--mesh")
    rates = override_rates(target_rates(args, cfg), args.rate)
    check_budget(args, rates)  # before any compile
    if spec.kind == "tpu":

        launch.start_tpu_compile("none", spec.accelerator_type(mesh.size))
    else:
        launch.start(
            deviceless_gpu=True,
            preset="lhs-pipelined" if args.schedule == "lhs-pipelined" else "lhs",
        )
    from tierax.solving import plan_check

    def gib(n: float | None) -> str:  # GiB, or MiB below 1 GiB; None: XLA stated no figure
        if n is None:
            return "—"
        return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / 2**20:.2f} MiB"

    def pct(e: float | None) -> str:
        return "—" if e is None else f"{e:+.1%}"

    def report(s) -> None:
        print(
            plan_check.iteration_line(s),
            file=sys.stderr if args.json else sys.stdout,  # --json: stdout is the JSON alone
            flush=True,
        )

    if args.max_microbatch:
        args.check_iterations = args.check_iterations or MAX_MICROBATCH_CHECK_ITERATIONS
        return _max_microbatch_check(args, cfg, mesh, rates, out, gib)
    res = plan_check.check_request(
        _request(args, cfg, mesh, rates),
        args.target,
        max_iterations=args.check_iterations or CHECK_ITERATIONS,
        report=report,
    )
    last = res.iterations[-1]
    # what decides fits: XLA:TPU's stated limit on a TPU, the device's memory on a GPU, and the
    # budget asked for
    spec = hardware.get_target(args.target)
    limit = getattr(spec, "xla_hbm_limit_bytes", 0) or rates.device_memory_bytes
    verdict = (
        f"XLA peak {gib(last.xla_peak_bytes)}, budget {gib(res.budget_bytes)} of the device's "
        f"{gib(limit)}: {'fits' if last.xla_fits else 'does NOT fit'}"
    )
    if out:
        plan = res.result.plan
        if not res.converged:  # written, but marked: the file says what the check found
            plan = dataclasses.replace(
                plan,
                description=f"NOT CONFIRMED by plan --check ({verdict}; {res.stopped}); "
                + plan.description,
            )
        write_text_atomic(out, plan.to_yaml())
        print(
            f"wrote {out}"
            + ("" if res.converged else " (marked NOT CONFIRMED in its description)"),
            file=sys.stderr if args.json else sys.stdout,
        )
    if args.json:
        print(json.dumps(res.to_json(), indent=2))
    print(
        f"check {'converged' if res.converged else 'did NOT converge'} after {len(res.iterations)} "
        f"compile(s): {verdict}, model error {pct(last.peak_error)}; {res.stopped}",
        file=sys.stderr if args.json else sys.stdout,  # --json: stdout is the JSON document alone
    )
    return 0 if res.converged else 1


def _plan_mesh_auto(args) -> int:
    """``tierax plan --mesh auto``: rank the meshes of --devices with their plans; write the
    winner (its mesh in the plan file)."""
    import dataclasses
    import time

    from tierax import hardware, records
    from tierax.fileio import write_text_atomic
    from tierax.solving.whatif import override_rates

    out = _plan_out(args)
    cfg = resolve_model(args, target=args.target)
    if args.target != "cpu":
        hardware.get_target(args.target)
    if args.check:
        spec = hardware.compile_target(args.target)  # a projection is refused here
    rates = override_rates(target_rates(args, cfg), args.rate)
    check_budget(args, rates)
    if args.check and spec.kind == "tpu":

        launch.start_tpu_compile("none", spec.accelerator_type(args.devices))
    elif args.check:
        launch.start(
            deviceless_gpu=True,
            preset="lhs-pipelined" if args.schedule == "lhs-pipelined" else "lhs",
        )
    else:
        launch.start()
    from tierax.report.tables import mesh_search_table
    from tierax.solving import for_maxtext as interop
    from tierax.solving import mesh_search

    budgets = {
        "schedule": args.schedule,
        "budget_bytes": args.budget_gib and args.budget_gib * GIB,
        "host_budget_bytes": args.host_budget_gib and args.host_budget_gib * GIB,
    }
    gb = args.global_batch or args.microbatch * args.devices
    args.top = args.top or TOP
    t0 = time.perf_counter()
    found = mesh_search.search(
        cfg, args.devices, rates, global_batch=gb, seq=args.seq, top=args.top, **budgets
    )
    mesh_search.check_fits(found)
    sens = mesh_search.sensitivity(found, rates, **budgets)
    wall = time.perf_counter() - t0
    doc = records.envelope(records.MESH_SEARCH_SCHEMA, records.command_line()) | (
        mesh_search.to_json(found, sens, wall) | {"target": args.target, "rates": rates.sources}
    )
    chosen = found.best
    if args.check:
        doc["check"], chosen = _mesh_check(found, cfg, args)
    if chosen is None:
        print("no candidate's compile fits; nothing written", file=sys.stderr)
        if args.json:
            print(json.dumps(doc, indent=2))
        return 1
    plan = dataclasses.replace(
        chosen.result.plan,
        planned_for=chosen.result.plan.planned_for.replace(model=model_identity(args)),
        description=chosen.result.plan.description
        + f"; mesh {chosen.mesh} chosen by --mesh auto at global batch {gb} × seq {args.seq}: "
        f"microbatch {chosen.microbatch}"
        + (f" × {chosen.grad_accum} accumulated" if chosen.grad_accum > 1 else ""),
    )
    text = (
        interop.emit(
            dataclasses.replace(chosen.result, plan=plan),
            cfg,
            args.emit,
            seq=args.seq,
            mesh=chosen.mesh.to_dict(),
            schedule=args.schedule,
            target=args.target,
            grad_accum=chosen.grad_accum,
        )
        if args.emit
        else plan.to_yaml()
    )
    if out:
        write_text_atomic(out, text)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    if args.emit and not out:
        print(text, end="")
        return 0
    title = (
        f"{cfg.name} · {args.target} · {args.devices} devices · global batch {gb} × seq {args.seq}"
    )
    console().print(mesh_search_table(doc, title))
    _print_mesh_summary(doc, chosen, out)
    return 0


def _print_mesh_summary(doc: dict, chosen, out) -> None:
    print(f"why: {doc['why']}")
    accum = (
        f"{chosen.grad_accum} accumulated microsteps of {chosen.microbatch}"
        if chosen.grad_accum > 1
        else f"microbatch {chosen.microbatch} per device"
    )
    print(f"winner {chosen.mesh}: {accum} (sequences per device of data×fsdp×expert)")
    for row in doc["sensitivity"]:
        w = ",".join(f"{a}={v}" for a, v in (row["winner"] or {}).items() if v > 1)
        print(
            f"{row['rate']} ×{row['factor']:g}: winner {w or '—'}"
            f"{' (same)' if row['same_winner'] else ''}; the top candidates rank "
            f"{row['baseline_ranks']}"
        )
    print(
        f"searched {doc['candidates_admitted']} meshes ({len(doc['refused'])} left out, "
        f"{doc['pruned_by_time_bound']} pruned by the time bound, {doc['no_fit_by_state_bound']} "
        f"by the state bound) in {doc['search_wall_s']:.1f} s; {doc['out_of_scope']}"
    )
    if out:
        print(f"wrote {out} (carries mesh {chosen.mesh})")


def _mesh_check(found, cfg, args):
    """``--mesh auto --check``: compile the top candidates deviceless; the best whose compile fits
    is chosen."""
    from tierax.xla import compile as compile_lib

    rows, chosen = [], None
    for c in found.ranked[: args.top]:
        compiled, _ = compile_lib.compile_for_target(
            cfg,
            c.result.plan,
            args.target,
            microbatch=c.microbatch,
            seq=args.seq,
            mesh=c.mesh,
        )
        rows.append(
            {
                "mesh": c.mesh.to_dict(),
                "fits": compiled.fits,
                "xla_peak_bytes": compiled.device_peak_bytes,
                "predicted_peak_bytes": c.result.predicted.peak_device_bytes,
                "compile_s": compiled.compile_time_s,
            }
        )
        print(
            f"check {c.mesh}: XLA peak {compiled.device_peak_bytes / GIB:.2f} GiB, predicted "
            f"{c.result.predicted.peak_device_bytes / GIB:.2f} GiB, "
            f"fits={'yes' if compiled.fits else 'NO'}",
            file=sys.stderr if args.json else sys.stdout,
            flush=True,
        )
        if compiled.fits and chosen is None:
            chosen = c
    return rows, chosen


def _max_microbatch_check(args, cfg, mesh, rates, out, gib) -> int:
    """``plan --max-microbatch --check``: the model's largest microbatch, confirmed and corrected by
    compiles."""
    import dataclasses

    from tierax.fileio import write_text_atomic
    from tierax.solving import plan_check

    def report(s) -> None:
        xla = "refused (out of memory)" if s.out_of_memory else gib(s.xla_peak_bytes)
        print(
            f"compile {s.iteration}: microbatch {s.microbatch} ({s.proposed_by}; correction "
            f"{gib(s.correction_bytes)}) · predicted {gib(s.predicted_peak_bytes)} · XLA {xla} · "
            f"fits={'yes' if s.xla_fits else 'NO'} · {s.compile_s:.0f} s",
            file=sys.stderr if args.json else sys.stdout,
            flush=True,
        )

    res = plan_check.max_microbatch_check(
        cfg,
        mesh,
        rates,
        args.target,
        seq=args.seq,
        schedule=args.schedule,
        budget_bytes=args.budget_gib and args.budget_gib * GIB,
        host_budget_bytes=args.host_budget_gib and args.host_budget_gib * GIB,
        max_compiles=args.check_iterations,
        report=report,
    )
    if out and res.result:
        plan = res.result.plan
        plan_for = plan.planned_for.replace(model=model_identity(args))
        write_text_atomic(out, dataclasses.replace(plan, planned_for=plan_for).to_yaml())
    if args.json:
        print(json.dumps(res.to_json(), indent=2))
    if res.result is None:
        print("no microbatch's plan fitted in XLA's compile", file=sys.stderr)
        return 1
    print(
        f"largest microbatch that fits XLA's compile: {res.result.microbatch} after "
        f"{len(res.steps)} compile(s)"
        + (
            ""
            if res.converged
            else f" (not confirmed: one more was not compiled within {args.check_iterations})"
        ),
        file=sys.stderr if args.json else sys.stdout,
    )
    if out and not args.json:
        print(f"wrote {out}")
    return 0


def _plan_sweep(args) -> int:
    """``tierax plan --sweep KEY=LO:HI:STEP``: the plan at every point, a table, and with ``--out
    F.png``
    the frontier as a picture plus its JSON record (``F.json``)."""
    from tierax import records
    from tierax.cli.common import progress
    from tierax.fileio import check_output_file, check_replaceable_file
    from tierax.report.sweep_plot import is_sweep_png, plot_sweep
    from tierax.report.tables import sweep_table
    from tierax.solving import whatif

    key, points = whatif.parse_sweep(args.sweep)
    if args.out and not args.out.endswith(".png"):
        raise TieraxError(
            f"--out {args.out!r}: with --sweep, --out is the PNG to draw (FILE.png; FILE.json "
            f"beside it)"
        )
    out = (
        check_replaceable_file(
            args.out, ours=is_sweep_png, what="a sweep plot tierax wrote", force=args.force
        )
        if args.out
        else None
    )
    if out:  # the user named F.png, not F.json: replace that only if an earlier sweep wrote it
        beside = check_output_file(out.with_suffix(".json"))
        records.check_replaceable(
            beside,
            records.SWEEP_SCHEMA,
            f"--out {args.out!r} writes its record beside it:",
            force=args.force,
        )
    cfg, mesh, rates = _inputs(args)
    solve = whatif.request_solver(_request(args, cfg, mesh, rates))
    with progress(f"sweep {key}", len(points), disable=args.json) as advance:
        pts = [
            p.to_json()
            for p in whatif.sweep(
                key, points, solve=solve, references=whatif.REFERENCES, progress=advance
            )
        ]
    segments = (
        "layer segments considered (--segments)"
        if args.segments
        else "whole layer groups (no --segments)"
    )
    title = _title(cfg, args, mesh, args.microbatch, f"{args.schedule} · sweep {key} · {segments}")
    if key == "microbatch":  # the swept value, not the --microbatch default
        title = title.replace(f"microbatch {args.microbatch}/device", "microbatch swept")
    doc = records.envelope(records.SWEEP_SCHEMA, records.command_line()) | {
        "title": title,
        "sweep": key,
        "segments": bool(args.segments),
        "rates": rates.sources,
        "references": list(whatif.REFERENCES),
        "points": pts,
    }
    if out:
        records.write_record(out.with_suffix(".json"), doc)
        plot_sweep(pts, key, out, title=title, references=whatif.REFERENCES)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        console().print(sweep_table(pts, key, title, whatif.REFERENCES))
        if out:
            print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


def cmd_calibrate(args) -> int:
    if any(getattr(args, k) is not None for k in ("runs", "out", "factors", "by")):
        from tierax.cli.calibrating import cmd_calibrate_runs

        return cmd_calibrate_runs(args)
    from tierax import costmodel as cm
    from tierax.cli.common import progress
    from tierax.fileio import check_output_file
    from tierax.report.tables import calibration_table

    check_output_file(cm.calibration_file(), "calibration file")
    launch.start(run_step=True)
    import jax

    from tierax.measure import calibrate

    platform = jax.devices()[0].platform
    if not args.json:
        print(launch.describe_backend())
    steps = calibrate.stages(platform == "gpu", platform == "tpu")
    with progress("calibrate", len(steps), disable=args.json) as advance:
        result = calibrate.run_and_save(lambda stage: advance(f"measured {stage}", 1))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        console().print(calibration_table(result))
    return 0
