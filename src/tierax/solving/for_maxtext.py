"""Planning for another tool: ``--for maxtext`` and ``--emit maxtext``, and how ``tierax plans``'
options combine (refused before any work where one would be ignored).

``--for maxtext`` solves (:func:`tierax.solving.planning.solve`) with one placement per activation
name across layer groups (what MaxText can express) and also without that restriction, so the
restriction's cost in predicted step time is reported (:func:`restriction_note`), not guessed.
What a plan is as MaxText keys: :func:`emit` (the overrides file), :func:`maxtext_overrides` (the
command line of a MaxText run of it).  The loop that compiles those keys with MaxText's own step
is :mod:`tierax.solving.maxtext_check`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tierax.errors import TieraxError
from tierax.interop import maxtext

if TYPE_CHECKING:  # the planner imports JAX: `tierax plans` reads and emits without it
    from tierax.solving import planner

TOOLS = ("maxtext",)


def check_tool(value: str | None, option: str) -> None:
    if value is not None and value not in TOOLS:
        raise TieraxError(f"{option} {value!r} is not supported; choose one of: {', '.join(TOOLS)}")


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
    grad_accum: int = 1,
) -> str:
    """A planner result written for ``tool`` (MaxText overrides), budgets and host bytes from the
    result; ``grad_accum``: microsteps per optimizer step (``plan --mesh auto``'s winner)."""
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
        grad_accum=grad_accum,
    )


def emit_plan(
    plan,
    cfg,
    tool: str,
    *,
    microbatch: int,
    seq: int,
    mesh: dict,
    schedule: str,
    target: str,
    grad_accum: int = 1,
) -> str:
    """A plan (preset or file, no planner run) written for ``tool``; no budget, so no memory
    fraction."""
    check_tool(tool, "--emit")
    return maxtext.overrides_yaml(
        plan,
        cfg,
        microbatch=microbatch,
        seq=seq,
        mesh=mesh,
        schedule=schedule,
        target=target,
        grad_accum=grad_accum,
    )


def maxtext_overrides(result: planner.PlanResult, run, user: Sequence[str]) -> list[str]:
    """The command-line overrides of a MaxText run of ``result``'s plan for the MaxText program
    ``run``: the user's keys the plan does not set, then the keys ``--emit maxtext`` writes."""
    from tierax.interop.maxtext_program import emit as emit_lib

    keys = emit_lib.overrides(
        result.plan,
        run,
        microbatch=result.microbatch,
        seq=run.program.seq,
        grad_accum=run.grad_accum,
    )
    return emit_lib.command_overrides(user, emit_lib.as_args(keys))
