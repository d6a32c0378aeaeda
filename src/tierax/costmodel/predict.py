"""The model's answer for a plan or explicit placements (:class:`Prediction`): the rows linear in
the plan (:mod:`tierax.costmodel.linear_terms`) at its indicator vector, and what is not linear
about them."""

from __future__ import annotations

from tierax import plan as plan_lib
from tierax.costmodel import linear_terms, network
from tierax.costmodel.first_touch import first_touch_s
from tierax.costmodel.fixed import exposed_share
from tierax.costmodel.linear_terms import keeps_unnamed
from tierax.costmodel.prediction import Breakdown, Prediction, peak_rows, phase_text
from tierax.costmodel.rates import Rates
from tierax.costmodel.resources import StepSplit
from tierax.costmodel.state import check_state, host_peak, offloaded_parts
from tierax.costmodel.terms import SCHEDULES
from tierax.errors import TieraxError
from tierax.tracing.model_program import takes_program
from tierax.tracing.program import Program

# keeps_unnamed, peak_rows, phase_text: imported from here by the report and the bench scripts
__all__ = [
    "Breakdown",
    "Prediction",
    "evaluate",
    "evaluate_terms",
    "keeps_unnamed",
    "peak_rows",
    "phase_text",
    "plan_placements",
    "simulate",
]


@takes_program(1)
def evaluate(
    placements: dict,
    prog: Program,
    rates: Rates,
    schedule: str,
    mechanism: str = plan_lib.DEFAULT_MECHANISM,
    state: dict | None = None,
    grad_accum: int = 1,
) -> Prediction:
    """The model for explicit placements ``{(group, name): Placement}`` (carry names may be
    omitted) and training-state placements ``state`` (layer group → StatePlacement; None or a
    group not listed: on device; :mod:`tierax.costmodel.state`), for a step of ``grad_accum``
    microbatches of ``prog``'s size per optimizer update.

    With ``grad_accum`` = A > 1 every microbatch runs its forward and backward (with its
    recomputation, copies and collectives) and the update runs once: step = A × (the microbatch's
    time less the update's HBM time) + the update + the accumulator's additions and exposed copies;
    the float32 accumulator adds its bytes to the microbatches' peak phases (less what is
    offloaded)."""
    if grad_accum < 1:
        raise TieraxError(f"grad_accum must be ≥ 1 (1: no accumulation), got {grad_accum}")
    check_state(state or {}, "simulate", grad_accum)
    if schedule not in SCHEDULES:
        raise TieraxError(f"unknown schedule {schedule!r}; choose one of: {', '.join(SCHEDULES)}")
    terms = linear_terms.build(prog, rates, schedule, mechanism, grad_accum)
    return evaluate_terms(terms, placements, state, prog)


def evaluate_terms(
    t: linear_terms.LinearTerms, placements: dict, state: dict | None, prog: Program
) -> Prediction:
    """:func:`evaluate` on the rows already built for ``prog`` (``t``): the plan's indicator
    vector's dot products with them, then what is not linear — the largest phase and staging, the
    copies and collectives exposed beyond their windows, the interference, the CPU's first
    touch."""
    P = plan_lib.Placement
    inv, rates, fx, a = prog.inventory, t.rates, t.fixed, t.grad_accum
    if not rates.offload_is_real:  # XLA:CPU keeps "offloaded" values on device
        placements = {k: (P.DEVICE if v is P.OFFLOAD else v) for k, v in placements.items()}
    x = t.indicators(placements, offloaded_parts(state or {}))
    act_bytes = t.activation_bytes.at(x)
    staging = max((r.at(x) for r in t.staging_bytes), default=0.0)
    sc = t.state_cost(x)
    accum = t.accumulator_bytes - sc.accum_freed_bytes  # the accumulator left on device (A > 1)
    phases = {label: r.at(x) + staging for label, r in t.microbatch_phase_rows()}
    micro_phase = max(phases.values())
    update_phase = t.update_phase_bytes.at(x) + sc.staging_bytes
    # the accumulation is a phase of its own only with an offloaded accumulator's slices
    accum_phase = (
        t.accumulation_phase_bytes.at(x) + sc.accum_staging_bytes if sc.accum_staging_bytes else 0
    )
    peak = int(max(micro_phase, update_phase, accum_phase))
    # What XLA:TPU assigns (and fits by): the peak without what an older libtpu's memory_analysis()
    # reports beyond its assignment (tierax.costmodel.fixed.FixedTerms.reported_excess_bytes).
    assigned_micro = max(r.at(x) for _, r in t.microbatch_phase_rows(assigned=True)) + staging
    assigned_peak = int(max(assigned_micro, update_phase, accum_phase))
    act_host = int(t.activation_host_bytes.at(x))
    host = host_peak(
        act_host, sc.host_bytes, sc.accum_host_bytes, shares=rates.host_state_shares_activations
    )
    recompute = t.recompute_s.at(x)
    recompute_hbm = t.recompute_hbm_s.at(x)
    recompute_attention = t.recompute_attention_s.at(x)
    recompute_collective = t.recompute_collective_s.at(x)
    # each group's copies exposed beyond the compute they hide under; on a TPU whose step peaks
    # above its scheduler's limit, the loads wait where they are consumed (none hidden)
    serialized = copies_serialized(rates, micro_phase)
    # (terms.exposed_stores: beyond the group's forward or beyond each store's own window)
    own = t.own_store_excess
    exposed_d2h = sum(
        max(0.0, t.d2h_s[i].at(x) - g.d2h_window_s, own[i].at(x)) for i, g in enumerate(t.groups)
    )
    exposed_h2d = sum(
        max(0.0, t.h2d_s[i].at(x) - (0.0 if serialized else g.h2d_window_s))
        for i, g in enumerate(t.groups)
    )
    transfer_total = t.transfer_s.at(x)
    hidden_copies = transfer_total - exposed_d2h - exposed_h2d
    exposed_coll = exposed_collectives(fx, t.schedule, recompute, hidden_copies)
    interference = interference_s(
        rates, fx.collective_s - exposed_coll + hidden_copies, fx.compute_s + recompute
    )
    first_touch = first_touch_s(peak, inv, rates)  # CPU only: 0 on GPU and TPU targets
    transpose = t.transpose_s.at(x)  # CPU only: 0 on GPU and TPU targets
    # The update's HBM time runs once per step; everything else of the microbatch A times.
    update_s, adds = t.update_hbm_s, t.accumulate_s
    exposed = exposed_d2h + exposed_h2d + exposed_coll
    micro = fx.compute_s + recompute + exposed + transpose + interference
    step = (
        (micro if a == 1 else a * (micro - update_s) + update_s + adds) + first_touch + sc.exposed_s
    )
    # The step by resource: the microbatch's parts A times, the update's HBM time once.
    gemm_micro = (fx.compute_s - fx.hbm_s - fx.fused_attention_s) + (
        recompute - recompute_hbm - recompute_attention - recompute_collective
    )
    memory_micro = fx.hbm_s + recompute_hbm
    split = StepSplit(
        gemm_s=a * gemm_micro,
        attention_s=a * (fx.fused_attention_s + recompute_attention),
        memory_s=memory_micro if a == 1 else a * (memory_micro - update_s) + update_s + adds,
        collective_s=a * (exposed_coll + recompute_collective + interference),
        other_s=a * (exposed_d2h + exposed_h2d + transpose) + first_touch + sc.exposed_s,
    )
    links = network.axis_links(inv.mesh, rates)
    # Each phase as the peak counts it: offloaded state freed, the accumulator left on device.
    per_phase = act_bytes + staging - sc.freed_bytes + accum
    if "microbatch phases" in phases:  # one row: FixedTerms' two phases
        layer_phase, loss_phase = per_phase + fx.layer_phase_bytes, per_phase + fx.loss_phase_bytes
    else:  # each group's layer backward less what it reads from the stacks (costmodel.kept_reads)
        loss_phase = phases["loss"]
        layer_phase = max(v for label, v in phases.items() if label != "loss")
    breakdown = Breakdown(
        state_bytes=fx.state_bytes,
        state_device_bytes=fx.state_bytes - sc.freed_bytes,
        activation_bytes=int(act_bytes),
        staging_bytes=int(staging),
        workspace_bytes=fx.workspace_bytes,
        logits_bytes=fx.logits_bytes,
        fixed_device_bytes=fx.fixed_device_bytes,
        stack_copy_bytes=fx.stack_copy_bytes,
        embed_grad_bytes=fx.embed_grad_bytes,
        late_grad_bytes=fx.late_grad_bytes,
        after_backward_bytes=fx.after_backward_bytes,
        accumulator_device_bytes=int(accum),
        peak_phase="update"
        if update_phase > micro_phase and update_phase >= accum_phase
        else "accumulation"
        if accum_phase > micro_phase
        else "loss"
        if loss_phase > layer_phase
        else "layer backward",
        layer_phase_bytes=int(layer_phase),
        loss_phase_bytes=int(loss_phase),
        update_phase_bytes=int(update_phase),
        accumulation_phase_bytes=int(accum_phase),
        assigned_peak_bytes=assigned_peak,
        reported_excess_bytes=fx.reported_excess_bytes,
        fit_limit_bytes=rates.usable_device_bytes,
        fit_limit=(
            "XLA:TPU's HBM limit" if rates.device_limit_bytes else "capacity − runtime reserve"
        ),
        activation_host_bytes=act_host,
        compute_s=fx.compute_s,
        hbm_s=fx.hbm_s,
        fused_attention_s=fx.fused_attention_s,
        recompute_s=recompute,
        recompute_hbm_s=recompute_hbm,
        transfer_s=transfer_total,
        exposed_d2h_s=exposed_d2h,
        exposed_h2d_s=exposed_h2d,
        collective_s=fx.collective_s,
        exposed_collective_s=exposed_coll,
        critical_collective_s=fx.critical_collective_s,
        interference_s=interference,
        first_touch_s=first_touch,
        transpose_s=transpose,
        accumulate_s=adds,
        microbatch_s=micro - update_s,
        update_hbm_s=update_s,
        executed_flops=a * (fx.executed_flops + t.recompute_flops.at(x)),
        model_flops=fx.model_flops * a,
        grad_accum=a,
        schedule=t.schedule,
        mechanism=t.mechanism,
        rates=rates.sources | network.describe(links, rates),
        network={k: v.to_json() for k, v in links.items() if v.link != "none"},
        state=sc,
        copies_serialized=serialized and transfer_total > 0,
        scheduler_limit_bytes=rates.scheduler_limit_bytes,
    )
    return Prediction(
        fits=assigned_peak <= rates.usable_device_bytes and host <= rates.host_memory_bytes,
        peak_device_bytes=peak,
        device_capacity_bytes=rates.device_memory_bytes,
        host_bytes=int(host),
        step_time_s=step,
        tflops_per_device=fx.model_flops * a / step / 1e12,
        breakdown=breakdown,
        split=split,
    )


def copies_serialized(rates: Rates, microbatch_peak: float) -> bool:
    """Whether XLA's scheduler issues the backward's host loads where they are consumed: on a TPU
    target, a step whose microbatch phases peak above :attr:`Rates.scheduler_limit_bytes` (the
    scheduler keeps the prefetched layer's buffer short-lived to stay within it)."""
    return bool(rates.scheduler_limit_bytes) and microbatch_peak > rates.scheduler_limit_bytes


def interference_s(rates: Rates, hidden_s: float, compute_s: float) -> float:
    """Seconds compute loses to the communication it hides (``rates.overlap_slowdown`` of the
    compute that runs beside it): ``hidden_s`` seconds of collectives and host copies hidden under
    compute, at most the ``compute_s`` there is (two hidden at once slow the same compute once)."""
    return rates.overlap_slowdown * min(max(0.0, hidden_s), compute_s)


def exposed_collectives(fx, schedule: str, recompute_s: float, hidden_copy_s: float) -> float:
    """Exposed collective seconds of a plan: the critical ones (tensor all-reduces, expert
    all-to-alls) whole, the rest under one overlap budget with the host copies — the step's compute
    and recomputation less the copies' hidden seconds (XLA's scheduler overlaps each asynchronous
    op with the compute between its start and its done; two such ops over the same compute are
    counted as sharing it, the conservative reading)."""
    hideable = fx.collective_s - fx.critical_collective_s
    window = fx.compute_s + recompute_s - hidden_copy_s
    return fx.critical_collective_s + exposed_share(hideable, window, schedule)


def plan_placements(plan: plan_lib.Plan, program) -> dict:
    """``plan`` as explicit placements ``{(group, name): Placement}``, with ``(group, UNNAMED)``
    for each group's unnamed intermediates (``program``: what the plan is resolved against, a
    :class:`~tierax.tracing.program.Program` or anything with its ``name`` and
    ``layer_groups()``)."""
    out = {
        (g, n): p for g, names in plan_lib.resolve(plan, program).items() for n, p in names.items()
    }
    unnamed = plan_lib.unnamed_placements(plan, program)
    out.update({(g, plan_lib.UNNAMED): p for g, p in unnamed.items()})
    return out


@takes_program(1)
def simulate(
    plan: plan_lib.Plan, prog: Program, rates: Rates, schedule: str, grad_accum: int = 1
) -> Prediction:
    """Predicted peak device bytes, host bytes and step time of ``plan``, ``grad_accum``
    microbatches of ``prog``'s size per update (:func:`evaluate`)."""
    return evaluate(
        plan_placements(plan, prog),
        prog.for_plan(plan),  # a segmented group: one scan, and one row, per segment
        rates,
        schedule,
        plan.mechanism,
        dict(plan.state),
        grad_accum,
    )
