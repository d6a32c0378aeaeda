"""``tierax simulate --maxtext CONFIG.yml [key=value ...]`` and ``tierax plan --maxtext ...``:
MaxText's own program (:func:`tierax.interop.maxtext_program.program`) priced and planned by
tierax's step model, over those verbs' flags.

``simulate --maxtext`` prices the program under MaxText's own ``remat_policy`` (the config's, or a
``remat_policy=...`` and its tensor keys given as key=value, or ``--plan``'s: a preset, plan file or
MaxText overrides as ``remat_policy: custom`` and its names,
:mod:`tierax.interop.maxtext_program.given_plan`), as ``compile --maxtext`` compiles it.
``plan --maxtext`` plans one placement per name (what MaxText's ``custom`` policy expresses) under
XLA's offload policy, the training state on device (MaxText offloads its optimizer state all or
none), and with ``--emit maxtext`` writes the MaxText keys of the plan
(:mod:`tierax.interop.maxtext_program.emit`); with ``--check`` each plan's keys are compiled as
MaxText's own step (:class:`tierax.solving.maxtext_check.MaxTextCompile`) in
:mod:`tierax.solving.plan_check`'s loop; with ``--max-microbatch`` the plan is for the largest
``per_device_batch_size`` the model fits (with ``--check``: that MaxText's compile confirms).
"""

from __future__ import annotations

import json
import sys

from tierax.cli import maxtext_program as maxtext_args
from tierax.errors import TieraxError
from tierax.sizes import size_text

GIB = 2**30


def _check_maxtext(args, verb: str) -> bool:
    """Whether ``verb`` runs on MaxText's program (:func:`maxtext_args.check_maxtext`), with the
    refusals simulate and plan share."""
    why = (
        f"{verb} --maxtext prices MaxText's own program (its keys go after --maxtext FILE as "
        "key=value); --model/--model-config/--set/--rates are for tierax's own models"
    )
    if not maxtext_args.check_maxtext(args, why, {"--rates": getattr(args, "rates", None)}):
        return False
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
    return True


def check_simulate(args) -> bool:
    """Whether ``simulate`` prices MaxText's program; what does not go with ``--maxtext`` is
    refused before any work.

    Raises:
      TieraxError: naming the option and what to do instead.
    """
    if not _check_maxtext(args, "simulate"):
        return False
    if getattr(args, "plan_given", False):
        from tierax.interop.maxtext_program import given_plan

        given_plan.check(args.plan, args.maxtext_overrides)
    return True


PLAN_REFUSED = {
    "sweep": "--sweep",
    "segments": "--segments (MaxText sets each name once for every layer)",
    "state_on_device": None,  # accepted: the state stays on device anyway
}


def check_plan(args) -> bool:
    """Whether ``plan`` plans MaxText's program; what does not go with ``--maxtext`` is refused
    before any work.

    Raises:
      TieraxError: naming the option and what to do instead.
    """
    if not _check_maxtext(args, "plan"):
        return False
    refused = [what for key, what in PLAN_REFUSED.items() if what and getattr(args, key, None)]
    if getattr(args, "global_batch", None) or getattr(args, "top", None):
        refused.append("--global-batch/--top (mesh search options)")
    if refused:
        raise TieraxError(
            f"{', '.join(refused)} not offered with plan --maxtext yet; plan --maxtext plans "
            "MaxText's program at its own batch and mesh"
        )
    if getattr(args, "max_microbatch", False):
        given = [
            k for k in args.maxtext_overrides if k.partition("=")[0] == "per_device_batch_size"
        ]
        if getattr(args, "microbatch_given", False):
            given.append(f"--microbatch {args.microbatch}")
        if given:
            raise TieraxError(
                f"--max-microbatch searches MaxText's per_device_batch_size; {', '.join(given)} "
                "would be ignored: drop it, or drop --max-microbatch to plan at that batch"
            )
    for option, value in (("--for", args.for_tool), ("--emit", args.emit)):
        if value not in (None, "maxtext"):
            raise TieraxError(f"{option} {value!r} with --maxtext: only maxtext")
    if args.schedule not in ("serial", "lhs", "lhs-pipelined"):
        raise TieraxError(
            f"unknown schedule {args.schedule!r}; choose one of: serial, lhs, lhs-pipelined"
        )
    if args.emit and args.json and not args.out:
        raise TieraxError(
            "--emit without --out prints the config, and --json prints the result: "
            "both on stdout; give --out FILE for the config, or drop one"
        )
    default_check(args)
    if getattr(args, "check_iterations", None) and not args.check:
        raise TieraxError("--check-iterations bounds --check's compiles; add --check or drop it")
    if args.check:
        from tierax import hardware

        hardware.compile_target(args.target)  # a projection (no XLA device spec) is refused here
        if args.devices is None and args.mesh is None:
            raise TieraxError(
                "plan --maxtext --check compiles MaxText's step for a slice of --devices N "
                f"{args.target} devices; give --devices (or --mesh AXIS=N,...)"
            )
    return True


# Where a plan of MaxText's program is not confirmed by MaxText's compile, it is planned within the
# budget divided by 1 + UNCONFIRMED_MARGIN: the largest under-prediction of MaxText's compiled peak
# (compiled ÷ predicted − 1) among the held-out cases of bench/results/maxtext_fidelity.json (the
# cases added after the rules were read; tests/test_maxtext_default_check.py reads it there).
UNCONFIRMED_MARGIN = 0.0367


def default_check(args) -> None:
    """``plan --maxtext``'s check by default: on a TPU target (MaxText's compile runs here) with
    the slice given (--devices or --mesh), ``--check`` unless ``--no-check``; ``args.unconfirmed``:
    why the plan will not be compiled (None where it will).

    Raises:
      TieraxError: --check with --no-check.
    """
    from tierax import hardware

    no_check = getattr(args, "no_check", False)
    if no_check and args.check:
        raise TieraxError("--check and --no-check: give one")
    args.unconfirmed = None
    if args.check:
        return
    if no_check:
        args.unconfirmed = "--no-check"
    elif getattr(hardware.get_target(args.target), "projection", None):
        args.unconfirmed = f"{args.target} is a projection: XLA has no device spec to compile for"
    elif hardware.get_target(args.target).kind != "tpu":
        args.unconfirmed = (
            f"{args.target}: MaxText's GPU compile is not run by default (--check runs it)"
        )
    elif args.devices is None and args.mesh is None:
        args.unconfirmed = "no --devices N (or --mesh) to compile MaxText's step for"
    else:
        args.check = True


def _program(args, start=None):
    """MaxText's program the options ask for, traced once ``start`` (default: the host platform,
    :func:`tierax.launch.start`) has started JAX; what MaxText prints goes to stderr (stdout
    carries tierax's output)."""
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):
        return _traced(args, start)


def _traced(args, start):
    from tierax.interop import maxtext_program

    maxtext_program.require_maxtext()
    from tierax import launch

    (start or launch.start)()
    return _trace(args, args.maxtext_overrides)


def _trace(args, overrides, microbatch: int | None = None):
    """MaxText's program of the options with ``overrides`` (JAX started); ``microbatch``: instead
    of --microbatch."""
    from tierax.interop import maxtext_program
    from tierax.mesh import parse_mesh

    mesh = parse_mesh(args.mesh, args.devices).to_dict() if args.mesh is not None else None
    if microbatch is None and getattr(args, "microbatch_given", False):
        microbatch = args.microbatch
    return maxtext_program.program(
        args.maxtext,
        overrides,
        target=args.target,
        devices=args.devices,
        mesh=mesh,
        microbatch=microbatch,
        seq=args.seq if getattr(args, "seq_given", False) else None,
        grad_accum=args.grad_accum,
    )


def _retrace(args):
    """``trace(keys, microbatch)`` for :func:`tierax.solving.maxtext_check.what_would_fit`: the
    user's keys with ``keys`` in place of theirs (and no per_device_batch_size where a microbatch
    is given); None where MaxText refuses them.  What MaxText prints goes to stderr."""
    import contextlib

    def trace(keys, microbatch):
        drop = {k.partition("=")[0] for k in keys}
        if microbatch is not None:
            drop.add("per_device_batch_size")
        user = [u for u in args.maxtext_overrides if u.partition("=")[0] not in drop]
        try:
            with contextlib.redirect_stdout(sys.stderr):
                return _trace(args, [*user, *keys], microbatch)
        except TieraxError:
            return None

    return trace


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
    if getattr(args, "plan_given", False):
        run = _with_plan(args, run)
    rates = _rates(args, run)
    pred = cm.simulate(run.plan, run.program, rates, args.schedule, run.grad_accum)
    for note in run.notes:
        print(f"note: {note}", file=sys.stderr)
    flags = _modelled(args)
    if args.json:
        doc = pred.to_json() | {
            "maxtext": {
                "flags": flags,
                "remat_policy": run.remat_policy,
                "given_plan": args.plan if getattr(args, "plan_given", False) else None,
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
            _title(args, run, run.program.microbatch, _policy_text(args, run)),
        )
    )
    print(_flags_note(args))
    return 0


def _modelled(args) -> dict[str, str]:
    """The libtpu/XLA flags the prediction models MaxText's program under."""
    from tierax.interop import maxtext as maxtext_interop

    return maxtext_interop.modelled_flags(args.target, args.schedule)


def _flags_note(args) -> str:
    """The line that names the flags a MaxText run (and ``compile --maxtext``) must set for the
    program predicted here to be the one it compiles."""
    from tierax.interop import maxtext as maxtext_interop

    flags = _modelled(args)
    if not flags:
        return "flags modelled: none (MaxText's program as XLA compiles it without flags)"
    return (
        f"flags modelled: {maxtext_interop.flags_text(flags)} — run MaxText with them (compile "
        "--maxtext compiles with them); without them XLA may compile a different program"
    )


def _policy_text(args, run) -> str:
    given = f" from --plan {args.plan}" if getattr(args, "plan_given", False) else ""
    return f"remat_policy {run.remat_policy}{given}"


def _with_plan(args, run):
    """MaxText's program of the options with ``--plan``'s keys (:mod:`.given_plan`) joined to the
    user's, traced again (the plan priced is MaxText's own policy of those keys); its notes on
    stderr."""
    import contextlib

    from tierax.interop.maxtext_program import given_plan

    keys, notes = given_plan.plan_keys(args.plan, run)
    overrides = given_plan.joined(args.maxtext_overrides, keys, args.plan)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    with contextlib.redirect_stdout(sys.stderr):
        return _trace(args, overrides)


def cmd_plan(args) -> int:
    """``tierax plan``: MaxText's program with ``--maxtext``, else tierax's model."""
    if not check_plan(args):
        if getattr(args, "no_check", False):
            raise TieraxError(
                "--no-check turns off plan --maxtext's confirming compile: it goes with --maxtext"
            )
        from tierax.cli import planning

        return planning.cmd_plan(args)
    from tierax import hardware
    from tierax.cli.planning import _plan_out

    out = _plan_out(args)
    hardware.get_target(args.target)
    devices, start = _check_start(args) if args.check else (None, None)
    if args.max_microbatch:
        return _plan_max_microbatch(args, out, devices, start)
    run = _program(args, start)
    req = _request(args, run)
    if args.check:
        return _plan_check(args, run, req, out, devices)
    return _plan_report(args, run, req, out)


def _request(args, run):
    """The planning request of MaxText's program ``run`` under the options (budgets checked)."""
    from tierax.solving import planning
    from tierax.solving.planning import check_budget, check_host_budget

    rates = _rates(args, run)
    budget = args.budget_gib and args.budget_gib * GIB
    host_budget = args.host_budget_gib and args.host_budget_gib * GIB
    check_budget(budget, rates, option="--budget-gib", unit=GIB)
    check_host_budget(host_budget, rates, option="--host-budget-gib", unit=GIB)
    if getattr(args, "unconfirmed", None) is not None:
        from tierax.solving.planner import budgets

        full = budgets(rates, budget, host_budget)[0]
        budget = full / (1 + UNCONFIRMED_MARGIN)
        args.unconfirmed_budgets = (full, budget)
    return planning.Request(
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
        remedies=REMEDIES,
    )


def _plan_report(args, run, req, out, extra: tuple[str, ...] = (), search=None) -> int:
    """The plan of ``req`` solved, written and shown (``extra``: lines to report after the
    notes; ``search``: --max-microbatch's summary, for --json)."""
    from tierax.cli.common import console
    from tierax.fileio import write_text_atomic
    from tierax.report.tables import explain_table, prediction_table
    from tierax.solving import planning

    result, notes = planning.solve(req)
    unconfirmed = _unconfirmed_note(args)
    notes = [*run.notes, *notes, STATE_NOTE, _flags_note(args), *extra, *unconfirmed]
    # the run's memory fraction from the user's budget, not the margin's (which is the model's)
    full = args.unconfirmed_budgets[0] if unconfirmed else None
    text = (
        _emitted(args, run, result, notes, budget_bytes=full)
        if args.emit
        else result.plan.to_yaml()
    )
    solved = result
    if args.emit:  # the figures shown (and the file's) are those of what MaxText runs
        result, lost = _as_emitted(args, text, run, req, result)
        if lost:
            peak = result.predicted.peak_device_bytes
            text = _emitted(args, run, solved, notes, predicted_peak=peak, budget_bytes=full)
            notes = [*notes, lost]
    if out:
        write_text_atomic(out, text)
    stream = sys.stderr if args.json or (args.emit and not out) else sys.stdout
    for line in notes:
        print(line, file=stream)
    if args.json or (args.emit and not out):
        doc = {**result.to_json(), "modelled_flags": _modelled(args), "notes": notes}
        doc |= {"confirmed": False, "compiles": 0, "unconfirmed_margin": UNCONFIRMED_MARGIN}
        if solved is not result:
            doc["solved"] = {"plan": solved.plan.to_dict(), "predicted": solved.predicted.to_json()}
        if search is not None:
            doc["max_microbatch"] = search | _choice(args, run, result)
        print(json.dumps(doc, indent=2) if args.json else text, end="" if not args.json else "\n")
        return 0
    title = _title(args, run, result.microbatch, args.schedule)
    console().print(explain_table(result, title))
    console().print(prediction_table(result.predicted, "predicted step"))
    if out:
        print(f"wrote {out}")
    return 0


def _as_emitted(args, text: str, run, req, result):
    """``result`` with the plan MaxText runs for the emitted ``text``'s keys and its prediction (as
    ``simulate --plan`` prices the file: MaxText's program traced again with the keys, its custom
    policy read back), and the words saying what the keys could not express of the plan solved
    and what that changes; ``result`` itself and "" where they express all of it."""
    import contextlib
    import dataclasses

    import yaml

    from tierax import costmodel as cm
    from tierax.interop.maxtext_program import emit, given_plan

    lost = emit.not_expressed(result.plan, run.program)
    if not lost:
        return result, ""
    data = yaml.safe_load(text)
    keys = emit.as_args({k: v for k, v in data.items() if k in given_plan.PLAN_KEYS})
    with contextlib.redirect_stdout(sys.stderr):  # what MaxText prints
        ran = _trace(
            args, emit.command_overrides(args.maxtext_overrides, keys), run.program.microbatch
        )
    pred = cm.simulate(ran.plan, ran.program, req.rates, req.schedule, ran.grad_accum)
    a, b = pred, result.predicted
    over = "" if a.peak_device_bytes <= result.budget_bytes else " (over the device budget)"
    return dataclasses.replace(result, plan=ran.plan, predicted=pred), (
        f"{lost}: the figures shown are the emitted keys' (what MaxText runs): peak "
        f"{size_text(a.peak_device_bytes)}{over}, step {a.step_time_s * 1e3:.2f} ms; the plan "
        f"solved, which MaxText cannot run: {size_text(b.peak_device_bytes)}, "
        f"{b.step_time_s * 1e3:.2f} ms"
    )


REMEDIES = (
    "Use a smaller per_device_batch_size or max_target_length, vocabulary tiling "
    "(num_vocab_tiling=N) (key=value after the config), more devices, or a larger device budget"
)
STATE_NOTE = (
    "training state on device (MaxText offloads all of its optimizer state or none; not planned "
    "here)"
)


def _devices(args) -> int:
    import math

    from tierax.mesh import parse_mesh

    if args.devices is not None:
        return args.devices
    return math.prod(parse_mesh(args.mesh, None).to_dict().values())


def _run_env(args, devices: int, result=None, budget_bytes=None) -> tuple[dict, list[str]]:
    """The environment a MaxText run of the plan sets (what ``--emit maxtext`` writes); without a
    result, what XLA reads when it compiles (no memory fraction or host limit)."""
    from tierax.interop import maxtext as maxtext_interop

    return maxtext_interop.runtime_env(
        target=args.target,
        schedule=args.schedule,
        devices=devices,
        budget_bytes=None if result is None else budget_bytes or result.budget_bytes,
        capacity_bytes=None if result is None else result.predicted.device_capacity_bytes,
        host_bytes=None if result is None else result.predicted.host_bytes,
    )


def _check_start(args):
    """``--check``: the devices the compile is for, and how JAX starts for it (MaxText's compile,
    with the environment of the run the emitted keys describe), refused before any work where no
    compile can run here."""
    from tierax import launch
    from tierax.interop.maxtext_program.config import require_maxtext

    require_maxtext()
    devices = _devices(args)
    env, _ = _run_env(args, devices)

    def start() -> None:
        from tierax import hardware
        from tierax.xla import compile as compile_lib

        launch.start_maxtext_compile(args.target, devices, env)
        if hardware.get_target(args.target).kind == "tpu":
            compile_lib.check_tpu_aot()
        else:
            compile_lib.check_gpu_aot()

    return devices, start


def _unconfirmed_note(args) -> list[str]:
    """The line that says a plan was predicted, not compiled: why, and the margin it keeps."""
    why = getattr(args, "unconfirmed", None)
    if why is None:
        return []
    full, kept = args.unconfirmed_budgets
    return [
        f"predicted, not compiled ({why}): MaxText's compile has not confirmed this plan; planned "
        f"within {kept / GIB:.2f} GiB, the device budget {full / GIB:.2f} GiB less a "
        f"{UNCONFIRMED_MARGIN:.1%} margin (the worst held-out under-prediction of MaxText's "
        "compiled peak in tierax's fidelity record)"
    ]


def _emitted(args, run, result, notes, *, predicted_peak=None, budget_bytes=None) -> str:
    """``--emit maxtext``'s file of ``result`` (``budget_bytes``: the device budget the run's
    memory fraction allows, default the result's)."""
    import math

    from tierax.interop.maxtext_program import emit

    env, why = _run_env(args, math.prod(run.mesh.values()), result, budget_bytes)
    return emit.overrides_yaml(
        result.plan,
        run,
        path=args.maxtext,
        user=args.maxtext_overrides,
        microbatch=result.microbatch,
        seq=run.program.seq,
        grad_accum=run.grad_accum,
        target=args.target,
        schedule=args.schedule,
        predicted_peak=result.predicted.peak_device_bytes
        if predicted_peak is None
        else predicted_peak,
        budget_bytes=budget_bytes or result.budget_bytes,
        host_bytes=result.predicted.host_bytes,
        env=env,
        why=why,
        notes=notes,
    )


CHECK_ITERATIONS = 4  # plan --maxtext --check's bound on MaxText compiles (plan --check's)


def _plan_check(args, run, req, out, devices: int) -> int:
    """``plan --maxtext --check``: :mod:`tierax.solving.plan_check`'s loop with each plan compiled
    as MaxText's own step with the plan's MaxText keys; the last plan whose compile fitted is
    written (exit 0 where the model then agreed, 1 where it did not); none fitted: exit 2 naming
    what does not fit and what would, nothing written."""
    from tierax.solving import plan_check

    stream = _stream(args, out)
    compile_plan = _compile(args, run, devices)

    def what_would_fit() -> str:
        print("no plan fits: tracing what would ...", file=sys.stderr, flush=True)
        head = run.program.head
        from tierax.solving import maxtext_check

        return maxtext_check.what_would_fit(
            req,
            _retrace(args),
            tiles=head.tiles if head else 1,
            microbatch=run.program.microbatch,
            seq=run.program.seq,
            miss=compile_plan.largest_miss,
        )

    from tierax.solving import planner

    try:
        res = _check_once(args, req, compile_plan, stream)
    except planner.NoPlanFits as e:
        raise TieraxError(f"{e} (nothing written). {what_would_fit()}") from None
    g = plan_check.size_text
    n = compile_plan.compiles
    if res.fitted is None:
        last = res.iterations[-1]
        need = (
            f"refused it for device memory (needs {g(last.xla_peak_bytes)})"
            if last.out_of_memory
            else f"peaks at {g(last.xla_peak_bytes)}"
        )
        raise TieraxError(
            f"no plan of MaxText's program fits {args.target}: in {n} compile(s) MaxText's compile "
            f"of the last plan {need}, above the budget {g(res.budget_bytes)} (the corrected model "
            f"predicted {g(last.predicted_peak_bytes)}; {res.stopped}); nothing written. "
            + REMEDIES
            + ". "
            + what_would_fit()
        )
    return _report_fitted(args, run, res, out, n)


def _stream(args, out):
    """Where lines go: stderr where stdout carries the JSON or the emitted file alone."""
    return sys.stderr if args.json or (args.emit and not out) else sys.stdout


def _compile(args, run, devices: int):
    """How --check compiles a plan of ``run``: MaxText's own step on ``devices`` devices."""
    from tierax.solving import maxtext_check

    if _mesh_size(run.mesh) != devices:
        raise TieraxError(
            f"MaxText's mesh for this config is {run.mesh} ({_mesh_size(run.mesh)} devices), not "
            f"--devices {devices}: its ici_*/dcn_* parallelism must multiply to --devices"
        )
    return maxtext_check.MaxTextCompile(
        run, path=args.maxtext, user=args.maxtext_overrides, target=args.target, devices=devices
    )


def _check_once(args, req, compile_plan, stream):
    """:func:`tierax.solving.plan_check.check_request` of ``req``, each plan compiled by
    ``compile_plan``, each iteration reported on ``stream``.

    Raises:
      planner.NoPlanFits: the model fits no plan at all.
    """
    from tierax.solving import plan_check

    return plan_check.check_request(
        req,
        args.target,
        compile_plan=compile_plan,
        max_iterations=args.check_iterations or CHECK_ITERATIONS,
        report=lambda s: print(plan_check.iteration_line(s), file=stream, flush=True),
    )


def _report_fitted(args, run, res, out, n: int, extra: tuple[str, ...] = (), search=None) -> int:
    """--check's plan written and shown: the last whose MaxText compile fitted (``n``: the
    compiles run; ``extra``: lines to report; ``search``: --max-microbatch's summary for --json);
    exit 0 where the model then agreed, 1 where it did not."""
    from tierax.fileio import write_text_atomic
    from tierax.solving import for_maxtext, plan_check

    stream = _stream(args, out)
    g = plan_check.size_text
    step = res.iterations[res.fitted_iteration - 1]
    verdict = (
        f"MaxText's compile of check {res.fitted_iteration}'s plan: peak {g(step.xla_peak_bytes)} "
        f"within the budget {g(res.budget_bytes)} (corrected model {g(step.predicted_peak_bytes)}, "
        f"{step.peak_error:+.1%})"
    )
    agreed = "" if res.converged else f"; NOT CONFIRMED: {res.stopped}"
    notes = [
        *run.notes,
        STATE_NOTE,
        _flags_note(args),
        f"plan --check: {n} MaxText compile(s); {verdict}{agreed}",
        *extra,
    ]
    if args.emit:
        text = _emitted(
            args,
            run,
            res.fitted,
            notes,
            predicted_peak=step.predicted_peak_bytes,
            budget_bytes=res.budget_bytes,
        )
    else:
        text = res.fitted.plan.to_yaml()
    if out:
        write_text_atomic(out, text)
        print(f"wrote {out}", file=stream)
    elif args.emit and not args.json:
        print(text, end="")
    if args.json:
        overrides = for_maxtext.maxtext_overrides(res.fitted, run, args.maxtext_overrides)
        doc = res.to_json() | {
            "plan": res.fitted.to_json(),  # the plan written (the last whose compile fitted)
            "last_solved_plan": res.result.to_json(),
            "compiles": n,
            "confirmed": True,  # the plan written is one MaxText's compile fitted
            "overrides": overrides,
            "modelled_flags": _modelled(args),
            "notes": notes,
        }
        if search is not None:
            doc["max_microbatch"] = search | _choice(args, run, res.fitted)
        print(json.dumps(doc, indent=2))
    elif not (args.emit and not out):
        from tierax.cli.common import console
        from tierax.report.tables import explain_table

        title = _title(args, run, res.fitted.microbatch, args.schedule)
        console().print(explain_table(res.fitted, title))
    for line in extra:
        print(line, file=stream)
    print(
        f"check {'converged' if res.converged else 'did NOT converge'} after {n} compile(s): "
        f"{verdict}; {res.stopped}",
        file=stream,
    )
    return 0 if res.converged else 1


def _choice(args, run, result) -> dict:
    """--max-microbatch's answer for --json: the batch, MaxText's policy per tensor, the predicted
    step time and tokens per second per chip."""
    from tierax.interop import maxtext_keys as K
    from tierax.interop.maxtext_program import emit

    keys = emit.overrides(
        result.plan,
        run,
        microbatch=result.microbatch,
        seq=run.program.seq,
        grad_accum=run.grad_accum,
    )
    pdb = keys["per_device_batch_size"]
    step = result.predicted.step_time_s
    return {
        "microbatch": result.microbatch,
        "per_device_batch_size": pdb,
        "policy": {k: keys[k] for k in K.REMAT_KEYS},
        "predicted_step_s": step,
        "tokens_per_s_per_chip": pdb * run.program.seq * run.grad_accum / step,
    }


# The most batches plan --maxtext --max-microbatch --check compiles, and the compiles at each batch
# (--check-iterations overrides it): the plan, then the corrected model's where the first did not
# fit (maxtext_check.check_batch).
MAX_BATCH_CHECKS = 4
BATCH_CHECK_ITERATIONS = 2


def _plan_max_microbatch(args, out, devices, start) -> int:
    """``plan --maxtext --max-microbatch``: the largest per_device_batch_size whose MaxText program
    the model fits a plan of (:class:`tierax.solving.maxtext_check.BatchSearch`, each batch traced
    once), planned and reported; with ``--check``, each batch the search proposes is checked by
    MaxText's compile (:func:`tierax.solving.maxtext_check.check_batch`); the model, its budget less
    what that compile needed beyond it (or plus what it needed less), proposes again, above the
    largest batch whose compile fitted and below the smallest whose compile did not, up to
    :data:`MAX_BATCH_CHECKS` batches."""
    import contextlib
    import dataclasses

    from tierax import launch
    from tierax.interop import maxtext_program
    from tierax.solving import maxtext_check, plan_check, planner

    with contextlib.redirect_stdout(sys.stderr):  # what MaxText prints, from its import on
        maxtext_program.require_maxtext()
        (start or launch.start)()
        first = _trace(args, args.maxtext_overrides, 1)  # MaxText's refusal is an error here
    req = _request(args, first)
    retrace = _retrace(args)
    search = maxtext_check.BatchSearch(req, lambda mb: first if mb == 1 else retrace([], mb))
    tensor = int(first.mesh.get("tensor", 1))
    stream = _stream(args, out)

    def pdb(mb: int) -> str:
        return f"{mb / tensor:g}"

    def at(mb: int):
        run = search.run(mb)
        return run, dataclasses.replace(req, program=run.program, microbatch=run.program.microbatch)

    print("searching the largest per_device_batch_size ...", file=sys.stderr, flush=True)
    model_mb = search.largest()
    if model_mb == 0:  # the planner's own message of what does not fit at the smallest batch
        from tierax.solving import planning

        planning.solve(req)
        raise TieraxError(  # not reached where the solve refuses, as it does when nothing fits
            f"no per_device_batch_size fits by the model, not even {pdb(1)}"
        )
    line = (
        f"largest per_device_batch_size the model fits: {pdb(model_mb)} ({search.traces} "
        "MaxText traces)"
    )
    summary = {
        "model_microbatch": model_mb,
        "model_per_device_batch_size": model_mb / tensor,
        "traces": search.traces,
    }
    if not args.check:
        run, req_mb = at(model_mb)
        summary["traces"] = search.traces
        return _plan_report(args, run, req_mb, out, (line,), summary)
    print(line, file=stream, flush=True)
    mb, miss, best, fail, checked, compiles = model_mb, 0, None, None, [], 0
    while len(checked) < MAX_BATCH_CHECKS:
        run, req_mb = at(mb)
        compile_plan = _compile(args, run, devices)
        print(f"checking per_device_batch_size {pdb(mb)} ...", file=stream, flush=True)
        try:
            res = maxtext_check.check_batch(
                req_mb,
                compile_plan,
                correction=miss,
                attempts=args.check_iterations or BATCH_CHECK_ITERATIONS,
                report=lambda s: print(plan_check.iteration_line(s), file=stream, flush=True),
            )
        except planner.NoPlanFits:
            res = None
        compiles += compile_plan.compiles
        fitted = res is not None and res.fitted is not None
        miss = max(compile_plan.misses, default=miss)  # this batch's compile less the model
        checked.append(
            {
                "per_device_batch_size": mb / tensor,
                "compiles": compile_plan.compiles,
                "fits": fitted,
                "miss_bytes": miss,
            }
        )
        if fitted:
            best = (mb, run, res)
        else:
            fail = mb
        # the model corrected by this compile proposes again, between the bracket's ends
        mb = search.largest(miss, below=fail)
        if mb <= (best[0] if best else 0) or mb == fail:
            mb = None
            break
    summary |= {"traces": search.traces, "batches_checked": checked, "compiles": compiles}
    g = size_text
    if best is None:
        tried = ", ".join(f"{c['per_device_batch_size']:g}" for c in checked)
        raise TieraxError(
            f"no per_device_batch_size of MaxText's program fits {args.target} in MaxText's "
            f"compile: {len(checked)} batch(es) checked in {compiles} compile(s) "
            f"({tried}), "
            f"MaxText's compile needing up to {g(miss)} beyond the model; nothing written. "
            + REMEDIES
        )
    if fail == best[0] + 1:
        confirmed = f"per_device_batch_size {pdb(fail)}: MaxText's compile refused it"
    elif mb is not None:  # stopped at MAX_BATCH_CHECKS with a larger batch proposed
        confirmed = (
            f"NOT CONFIRMED: the corrected model fits {pdb(mb)}, not checked "
            f"({MAX_BATCH_CHECKS} batches)"
        )
    else:
        confirmed = f"per_device_batch_size {pdb(best[0] + 1)}: the corrected model fits none"
    mb, run, res = best
    lines = (
        line,
        f"largest per_device_batch_size MaxText's compile confirms: {pdb(mb)} ({confirmed}; "
        f"{len(checked)} batch(es) checked, {compiles} MaxText compile(s) in all)",
    )
    return _report_fitted(args, run, res, out, compiles, lines, summary)


def _mesh_size(mesh) -> int:
    import math

    return math.prod(int(n) for n in mesh.values())
