"""How ``tierax plan``'s and ``tierax plans``' options combine (refused before any work where one
would be ignored), and planning for another tool: ``--for maxtext`` and ``--emit maxtext``.

``--for maxtext`` solves with one placement per activation name across layer groups
(what MaxText can express) and also solves without that restriction, so the
restriction's cost in predicted step time is reported, not guessed.
"""

from __future__ import annotations

from tierax import inventory as inv_lib
from tierax import planner
from tierax.errors import TieraxError
from tierax.interop import maxtext

TOOLS = ("maxtext",)


def check_tool(value: str | None, option: str) -> None:
    if value is not None and value not in TOOLS:
        raise TieraxError(f"{option} {value!r} is not supported; choose one of: {', '.join(TOOLS)}")


def check_plan_options(
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
) -> None:
    """``tierax plan``: refuse, before any work, a combination of options where one would be
    ignored.  (``--segments`` combines with ``--sweep`` and ``--check``.)"""
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
    if segments and (for_tool or max_microbatch):
        raise TieraxError(
            "--segments plans layer ranges separately, which "
            + (
                "MaxText cannot express (one placement per name for all layers); drop --for"
                if for_tool
                else "--max-microbatch does not search; plan at a given --microbatch"
            )
        )
    if emit and json and not out:
        raise TieraxError(
            "--emit without --out prints the config, and --json prints the result: "
            "both on stdout; give --out FILE for the config, or drop one"
        )
    check_tool(for_tool, "--for")
    check_tool(emit, "--emit")


def check_show_options(*, show: str | None, yaml: bool, emit: str | None, sizing: dict) -> None:
    """``tierax plans``: refuse an option the request would ignore.  ``sizing``: option → value
    (None when not given) of the options that size ``--emit``'s config."""
    if (yaml or emit) and show is None:
        raise TieraxError(f"{'--yaml' if yaml else '--emit'} prints one plan; add --show PLAN")
    if yaml and emit:
        raise TieraxError("--yaml and --emit both print the plan; give one")
    given = [k for k, v in sizing.items() if v is not None]
    if given and not emit:
        one = len(given) == 1
        raise TieraxError(
            f"{', '.join(given)} only size{'s' if one else ''} the config --emit "
            "writes (nothing without it); add --emit maxtext, or drop " + ("it" if one else "them")
        )
    check_tool(emit, "--emit")


def solve(
    cfg,
    mesh: dict,
    rates,
    *,
    microbatch: int,
    seq: int,
    max_microbatch: bool = False,
    for_tool: str | None = None,
    segments: bool = False,
    **budgets,
) -> tuple[planner.PlanResult, list[str]]:
    """The planner's result (restricted to one placement per name for MaxText) and lines to
    report."""
    check_tool(for_tool, "--for")
    if segments and (for_tool or max_microbatch):
        raise TieraxError(
            "--segments plans layer ranges separately, which "
            + (
                "MaxText cannot express (one placement per name for all layers); drop --for"
                if for_tool
                else "--max-microbatch does not search; plan at a given --microbatch"
            )
        )

    def run(uniform: bool, mechanism: str = planner.DEFAULT_MECHANISM) -> planner.PlanResult:
        if max_microbatch:
            return planner.max_microbatch(
                cfg,
                seq,
                mesh,
                rates,
                one_placement_per_name=uniform,
                mechanism=mechanism,
                **budgets,
            )
        return planner.plan(
            cfg,
            inv_lib.model_inventory(cfg, microbatch, seq, mesh),
            rates,
            one_placement_per_name=uniform,
            segments=segments,
            mechanism=mechanism,
            **budgets,
        )

    if for_tool is None:
        return run(False), []
    # MaxText moves offloaded names with XLA's offload policy, so its plan is planned for that
    # mechanism, and so is the unrestricted plan it is compared with; `tierax plan` without --for
    # plans tierax's own prefetching scan, whose time is reported beside them.
    restricted, free = run(True, "policy"), run(False, "policy")
    return restricted, [restriction_note(restricted, free, run(False))]


def restriction_note(
    restricted: planner.PlanResult, free: planner.PlanResult, own: planner.PlanResult | None = None
) -> str:
    """What one placement per name costs, in predicted step time (and microbatch, if it changed),
    both plans under XLA's offload policy; ``own``: the plan for tierax's prefetching scan."""
    a, b = restricted.predicted.step_time_s, free.predicted.step_time_s
    mb = (
        f"; microbatch {restricted.microbatch} vs {free.microbatch}"
        if restricted.microbatch != free.microbatch
        else ""
    )
    mech = "both with XLA's offload policy (mechanism: policy, what MaxText runs)"
    if own is not None:
        mech += (
            f"; `tierax plan` without --for plans tierax's prefetching scan: "
            f"{own.predicted.step_time_s * 1e3:.4g} ms"
        )
    what = "MaxText restriction (one placement per name across layer groups)"
    if restricted.microbatch == free.microbatch and abs(a - b) <= 1e-12 * max(a, b, 1e-30):
        return f"{what} costs nothing here: predicted step {a * 1e3:.4g} ms either way{mb}, {mech}"
    return (
        f"{what}: predicted step {a * 1e3:.4g} ms vs {b * 1e3:.4g} ms unrestricted "
        f"({(a / b - 1) * 100:+.2f} %){mb}, {mech}"
    )


def emit(
    result: planner.PlanResult,
    cfg,
    tool: str,
    *,
    seq: int,
    mesh: dict,
    schedule: str,
    target: str,
    notes: tuple[str, ...] = (),
) -> str:
    """A planner result written for ``tool`` (MaxText overrides), budgets and host bytes from the
    result."""
    check_tool(tool, "--emit")
    return maxtext.overrides_yaml(
        result.plan,
        cfg,
        microbatch=result.microbatch,
        seq=seq,
        mesh=mesh,
        schedule=schedule,
        target=target,
        budget_bytes=result.budget_bytes,
        capacity_bytes=result.predicted.device_capacity_bytes,
        host_bytes=result.predicted.host_bytes,
        notes=notes,
    )


def emit_plan(
    plan, cfg, tool: str, *, microbatch: int, seq: int, mesh: dict, schedule: str, target: str
) -> str:
    """A plan (preset or file, no planner run) written for ``tool``; no budget, so no memory
    fraction."""
    check_tool(tool, "--emit")
    return maxtext.overrides_yaml(
        plan, cfg, microbatch=microbatch, seq=seq, mesh=mesh, schedule=schedule, target=target
    )
