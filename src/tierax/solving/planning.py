"""One way to solve a plan: :func:`solve` of a :class:`Request`.

``tierax plan`` (plain, ``--sweep`` at every point, ``--check`` at every iteration), the Python API
(:func:`tierax.api.plan`) and :mod:`tierax.solving.plan_check` all reach the planner through
:func:`solve`, so an option means the same everywhere.  The combinations of ``tierax plan``'s
options that cannot work are refused in one place, :func:`check_options`, before any work;
:func:`solve` refuses the same ones a :class:`Request` can express.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tierax.errors import TieraxError
from tierax.plan import DEFAULT_MECHANISM, PlannedFor
from tierax.sizes import size_text
from tierax.solving import for_maxtext as interop
from tierax.solving import planner
from tierax.tracing import model_program
from tierax.tracing.program import Program


@dataclass(frozen=True)
class Request:
    """What to plan.  ``mesh``: axis sizes (a dict); ``program``: the program to plan (the
    Python API's trace, or one the caller reuses; ``cfg`` then only names it); without it the
    model's program is traced at ``microbatch`` × ``seq`` on ``mesh``
    (:func:`tierax.tracing.model_program.program_of`).  ``max_microbatch``: plan the largest
    microbatch that fits instead of ``microbatch``; ``for_tool``: one placement per name (what the
    tool expresses), with a note on what that costs; ``remedies``: what a no-fit message suggests
    (default: CLI options); ``place_state``: place the training state (moments, master weights,
    the gradient accumulator) in the same program (False: keep it on device); ``grad_accum``:
    microbatches per optimizer update (the planner prices the accumulation and may offload its
    accumulator); ``model``: how the plan's ``planned_for`` names the model (default: the config's
    name, or the given program's).

    The solved plan records what it was planned for (:func:`planned_for`)."""

    cfg: object
    mesh: dict
    rates: object
    microbatch: int = 1
    seq: int = 1
    schedule: str = "lhs"
    budget_bytes: float | None = None
    host_budget_bytes: float | None = None
    segments: bool = False
    max_microbatch: bool = False
    for_tool: str | None = None
    mechanism: str = DEFAULT_MECHANISM
    name: str = "planned"
    remedies: str | None = None
    program: Program | None = None
    place_state: bool = True  # also place the training state (False: all of it on device)
    grad_accum: int = 1  # microbatches per optimizer update
    # the model's entry in the plan's planned_for (tierax.plan.planned_for.model_name / digest)
    model: str | None = None


def _segments_conflict(*, segments: bool, for_tool, max_microbatch: bool) -> None:
    if segments and (for_tool or max_microbatch):
        raise TieraxError(
            "--segments plans layer ranges separately, which "
            + (
                "MaxText cannot express (one placement per name for all layers); drop --for"
                if for_tool
                else "--max-microbatch does not search; plan at a given --microbatch"
            )
        )


def check_options(
    *,
    sweep: str | None = None,
    check: bool = False,
    check_iterations: int | None = None,
    segments: bool = False,
    for_tool: str | None = None,
    emit: str | None = None,
    max_microbatch: bool = False,
    out: str | None = None,
    json: bool = False,
    mesh: str | None = None,
    devices: int | None = None,
    global_batch: int | None = None,
    top: int | None = None,
    grad_accum: int | None = None,
    microbatch_given: bool = False,
) -> None:
    """``tierax plan``: refuse, before any work, a combination of options where one would be
    ignored.  (``--segments`` combines with ``--sweep`` and ``--check``.)"""
    if mesh == "auto":
        given = [
            o
            for o, on in (
                ("--sweep", sweep),
                ("--for", for_tool),
                ("--max-microbatch", max_microbatch),
                ("--segments", segments),
                ("--check-iterations", check_iterations is not None),
                ("--grad-accum", grad_accum is not None),
            )
            if on
        ]
        if given:
            raise TieraxError(
                f"--mesh auto ranks meshes at a fixed global batch, and {', '.join(given)} "
                "cannot combine with it; run --mesh auto first, then plan its mesh "
                "(--mesh data=…,fsdp=…) with them"
            )
        if devices is None:
            raise TieraxError("--mesh auto searches the meshes of --devices N; give --devices")
    elif global_batch is not None:
        raise TieraxError(
            "--global-batch is the batch every --mesh auto candidate trains; add --mesh auto, "
            "or give --microbatch (sequences per device) for one mesh"
        )
    elif top is not None:
        raise TieraxError("--top sizes --mesh auto's ranking; add --mesh auto or drop it")
    one_plan = [
        o
        for o, given in (
            ("--check", check),
            ("--emit", emit),
            ("--for", for_tool),
            ("--max-microbatch", max_microbatch),
        )
        if given
    ]
    if sweep and one_plan:
        one = len(one_plan) == 1
        raise TieraxError(
            f"--sweep solves one plan per point and {', '.join(one_plan)} "
            f"appl{'ies' if one else 'y'} to a single plan; drop "
            f"{'it' if one else 'them'}, or plan one point without --sweep"
        )
    if check and (emit or for_tool):
        raise TieraxError("--check compiles the plan it chooses; drop --emit/--for")
    if check_iterations is not None and not check:
        raise TieraxError(
            "--check-iterations bounds the compiles of --check; add --check or drop it"
        )
    _segments_conflict(segments=segments, for_tool=for_tool, max_microbatch=max_microbatch)
    _accum_conflict(grad_accum or 1, max_microbatch)
    if emit and json and not out:
        raise TieraxError(
            "--emit without --out prints the config, and --json prints the result: "
            "both on stdout; give --out FILE for the config, or drop one"
        )
    interop.check_tool(for_tool, "--for")
    interop.check_tool(emit, "--emit")
    if max_microbatch and microbatch_given:
        raise TieraxError(
            "--max-microbatch searches the microbatch, so --microbatch would be ignored; drop "
            "--microbatch, or drop --max-microbatch to plan that microbatch"
        )


def _accum_conflict(grad_accum: int, max_microbatch: bool) -> None:
    if grad_accum > 1 and max_microbatch:
        raise TieraxError(
            "--max-microbatch searches the largest microbatch of one microstep per update; drop "
            "--grad-accum, or plan a given --microbatch with --grad-accum N"
        )


def check_budget(budget_bytes: float | None, rates, *, option: str, unit: float = 1) -> None:
    """Refuse a device budget above what the target's device offers (a plan for it could never
    run there): ``tierax plan --budget-gib`` and :func:`tierax.api.plan` check here, before any
    work (not in :func:`solve`, whose callers may raise a corrected budget above it).
    ``option``: how the budget was given (``--budget-gib``, ``budget=``) and ``unit``: the bytes
    of one unit it was given in, for the message.

    Raises:
      TieraxError: naming the capacity, the usable part and the largest budget to give.
    """
    usable = rates.usable_device_bytes
    if budget_bytes is None or budget_bytes <= usable:
        return
    sep = " " if option.startswith("--") else ""

    def shown(n: float) -> str:  # in the option's unit: GiB to 2 decimals, bytes whole
        return f"{n:.0f}" if unit == 1 else f"{n / unit:g}"

    raise TieraxError(
        f"{option}{sep}{shown(budget_bytes)} is more than {rates.target}'s device offers: "
        f"capacity {size_text(rates.device_memory_bytes)}, of which a step may use "
        f"{size_text(usable)}; give {option}{sep}"
        f"{shown(math.floor(usable / unit * 100) / 100 * unit if unit != 1 else usable)} or less "
        "(or leave it out: that is the default)"
    )


def check_host_budget(
    host_budget_bytes: float | None, rates, *, option: str, unit: float = 1
) -> None:
    """Refuse a host budget above the target's host memory per device (offloaded bytes beyond it
    could never be held there); ``option``/``unit`` as :func:`check_budget`'s.  A target whose
    host memory is not known (0) is not checked.

    Raises:
      TieraxError: naming the host memory per device and the largest budget to give.
    """
    host = rates.host_memory_bytes
    if host_budget_bytes is None or not host or host_budget_bytes <= host:
        return
    sep = " " if option.startswith("--") else ""

    def shown(n: float) -> str:
        return f"{n:.0f}" if unit == 1 else f"{n / unit:g}"

    limit = math.floor(host / unit * 100) / 100 * unit if unit != 1 else host
    raise TieraxError(
        f"{option}{sep}{shown(host_budget_bytes)} is more than {rates.target}'s host memory per "
        f"device ({size_text(host)}); give {option}{sep}{shown(limit)} or less (or leave "
        "it out: that is the default; --rate host_memory=GB models a host with more)"
    )


def planned_for(req: Request, result: planner.PlanResult) -> PlannedFor:
    """What ``result``'s plan was planned for: the request's target, mesh, microbatch (the one
    found, with ``max_microbatch``), seq, accumulation, schedule and model; a request with its
    own program (the Python API) records no microbatch or seq (the program's trace has them)."""
    from tierax.mesh import MeshShape

    traced = req.program is None
    return PlannedFor(
        model=req.model or (req.cfg.name if traced else req.program.name),
        target=req.rates.target,
        mesh=MeshShape(**req.mesh).to_dict(),  # every axis named; a request naming none: 1 device
        microbatch=result.microbatch if traced else None,
        seq=req.seq if traced else None,
        grad_accum=req.grad_accum,
        schedule=req.schedule,
    )


def check_request(req: Request) -> None:
    """Refuse a request whose options cannot work together (the subset of :func:`check_options` a
    request expresses)."""
    interop.check_tool(req.for_tool, "--for")
    _accum_conflict(req.grad_accum, req.max_microbatch)
    _segments_conflict(
        segments=req.segments, for_tool=req.for_tool, max_microbatch=req.max_microbatch
    )
    if req.program is not None and req.max_microbatch:
        raise TieraxError(
            "max_microbatch traces the model at several microbatches; it cannot use a given program"
        )


def program(req: Request, cache: dict | None = None) -> Program:
    """The request's program (given, or traced; ``cache``: microbatch → program, reused)."""
    if req.program is not None:
        return req.program
    if cache is None:
        return model_program.program_of(req.cfg, req.microbatch, req.seq, req.mesh)
    if req.microbatch not in cache:
        cache[req.microbatch] = model_program.program_of(req.cfg, req.microbatch, req.seq, req.mesh)
    return cache[req.microbatch]


def solve(req: Request, cache: dict | None = None) -> tuple[planner.PlanResult, list[str]]:
    """The planner's result for ``req`` and lines to report (``--for``: what its restriction
    costs).

    Raises:
      TieraxError: options that cannot work together; planner.NoPlanFits: nothing fits.
    """
    check_request(req)

    def run(uniform: bool, mechanism: str) -> planner.PlanResult:
        common = {
            "schedule": req.schedule,
            "budget_bytes": req.budget_bytes,
            "host_budget_bytes": req.host_budget_bytes,
            "one_placement_per_name": uniform,
            "mechanism": mechanism,
            "place_state": req.place_state,
        }
        if req.max_microbatch:
            return planner.max_microbatch(req.cfg, req.seq, req.mesh, req.rates, **common)
        return planner.plan(
            program(req, cache),
            req.rates,
            name=req.name,
            segments=req.segments,
            remedies=req.remedies,
            grad_accum=req.grad_accum,
            **common,
        )

    def stamped(result: planner.PlanResult) -> planner.PlanResult:
        plan = dataclasses.replace(result.plan, planned_for=planned_for(req, result))
        return dataclasses.replace(result, plan=plan)

    if req.for_tool is None:
        result = stamped(run(False, req.mechanism))
        return result, _search_notes(result)
    # MaxText moves offloaded names with XLA's offload policy, so its plan is planned for that
    # mechanism, and so is the unrestricted plan it is compared with; `tierax plan` without --for
    # plans tierax's own prefetching scan, whose time is reported beside them.
    restricted, free = stamped(run(True, "policy")), run(False, "policy")
    return restricted, [
        interop.restriction_note(restricted, free, run(False, req.mechanism)),
        *_search_notes(restricted),
    ]


def _search_notes(result: planner.PlanResult) -> list[str]:
    if result.search_stopped_at is None:
        return []
    n = result.search_stopped_at
    return [
        f"largest microbatch that fits: at least {n:,}; the search stops at {n:,} (a larger one "
        "may fit too)"
    ]
