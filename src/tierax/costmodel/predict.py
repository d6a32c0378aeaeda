"""The model's answer for a plan or explicit placements (:class:`Prediction`): peak bytes, host
bytes, step
time and their breakdown."""

from __future__ import annotations

from dataclasses import dataclass

from tierax import names as N
from tierax import plan as plan_lib
from tierax.costmodel import network
from tierax.costmodel.first_touch import first_touch_s
from tierax.costmodel.fixed import exposed_share, fixed_terms
from tierax.costmodel.rates import Rates, for_program
from tierax.costmodel.resources import StepSplit
from tierax.costmodel.state import (
    accumulate_s,
    accumulator_bytes,
    check_state,
    host_peak,
    offloaded_parts,
    state_cost,
)
from tierax.costmodel.terms import SCHEDULES, group_terms, item_terms, staging_and_window
from tierax.costmodel.transposes import transpose_s
from tierax.errors import TieraxError
from tierax.tracing import hbm
from tierax.tracing.model_program import accepts_config
from tierax.tracing.program import Program


@dataclass(frozen=True)
class Prediction:
    fits: bool
    peak_device_bytes: int
    device_capacity_bytes: int
    host_bytes: int
    step_time_s: float
    tflops_per_device: float
    breakdown: dict
    # the step time by resource (tierax.costmodel.resources); None: not split
    split: StepSplit | None = None

    def to_json(self) -> dict:
        return {
            "fits": self.fits,
            "peak_device_bytes": self.peak_device_bytes,
            "device_capacity_bytes": self.device_capacity_bytes,
            "host_bytes": self.host_bytes,
            "step_time_s": self.step_time_s,
            "tflops_per_device": self.tflops_per_device,
            "breakdown": self.breakdown,
        } | ({"split": self.split.to_json()} if self.split is not None else {})


PHASE_TEXT = {
    "layer backward": "in a layer backward",
    "loss": "at the loss",
    "update": "in the streamed optimizer update",
    "accumulation": "in a gradient accumulation",
}


def phase_text(breakdown: dict) -> str:
    """Where the predicted peak is, in words ("in a layer backward", "at the loss", "in the
    streamed optimizer update", "in a gradient accumulation")."""
    return PHASE_TEXT[breakdown["peak_phase"]]


def peak_rows(breakdown: dict) -> list[tuple[str, int]]:
    """The terms of the predicted peak, in the phase that peaks (:class:`FixedTerms`: a layer's
    backward holds its workspace, the loss the logits and their gradient, less the embedding and
    head gradients not yet written): (label, bytes) rows that sum to the peak."""
    b = breakdown
    if b["peak_phase"] == "update":  # the streamed update: the state left on device, its slices
        return [
            ("params + grads + AdamW left on device", b["state_device_bytes"]),
            ("the update's staged state slices", b.get("state_update_staging_bytes", 0)),
            ("the runtime's fixed device memory", b.get("fixed_device_bytes", 0)),
        ]
    if b["peak_phase"] == "accumulation":  # a microbatch's gradients added to the accumulator
        return [
            ("params + grads + AdamW left on device", b["state_device_bytes"]),
            ("the gradient accumulator left on device", b.get("accumulator_device_bytes", 0)),
            ("the accumulation's staged slices", b.get("state_accum_staging_bytes", 0)),
            ("the runtime's fixed device memory", b.get("fixed_device_bytes", 0)),
        ]
    loss = b["peak_phase"] == "loss"
    on_device = b.get("state_device_bytes", b["state_bytes"])  # moments on host leave the peak
    state = on_device - (b.get("embed_grad_bytes", 0) if loss else 0)
    rows = [
        (
            "params + grads + AdamW"
            + (" on device" if on_device != b["state_bytes"] else "")
            + (
                ", less the embedding and head gradients not yet written"
                if state != on_device
                else ""
            ),
            state,
        ),
        ("activations on device", b["activation_bytes"]),
        ("transfer staging", b["staging_bytes"]),
        ("logits, their gradient, the head's gradient", b["logits_bytes"])
        if loss
        else ("one layer's workspace", b["workspace_bytes"]),
        ("XLA's transposed weight stacks", b.get("stack_copy_bytes", 0)),
    ]
    if b.get("accumulator_device_bytes"):
        rows.append(("the float32 gradient accumulator on device", b["accumulator_device_bytes"]))
    if b.get("fixed_device_bytes"):
        rows.append(("the runtime's fixed device memory", b["fixed_device_bytes"]))
    return rows


@accepts_config(1)
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
    P = plan_lib.Placement
    inv = prog.inventory
    rates = for_program(rates, prog)  # the fused attention kernel at the program's shape
    items = item_terms(inv, rates, mechanism)
    groups = group_terms(inv, rates, schedule, mechanism)
    staged_layers = staging_and_window(schedule, mechanism)[0]
    fx = fixed_terms(prog, rates, schedule)
    links = network.axis_links(inv.mesh, rates)
    if not rates.offload_is_real:  # XLA:CPU keeps "offloaded" values on device
        placements = {k: (P.DEVICE if v is P.OFFLOAD else v) for k, v in placements.items()}
    act_bytes = host = 0
    recompute = recompute_hbm = exposed_d2h = exposed_h2d = transfer_total = staging = 0.0
    recompute_flops = recompute_attention = recompute_collective = 0.0
    for g in groups:
        mine = [i for i in items if i.group == g.name]
        no_remat = keeps_unnamed(placements, g.name, [i.name for i in mine])
        act_bytes += g.base_bytes + sum(
            i.bytes for i in mine if placements[(g.name, i.name)] is P.DEVICE
        )
        if no_remat:
            act_bytes += g.save_all_extra_bytes
        else:
            remat = [i for i in mine if placements[(g.name, i.name)] is P.REMAT]
            g_recompute = g.base_recompute_s + sum(i.recompute_s for i in remat)
            g_recompute_hbm = g.base_recompute_hbm_s + sum(i.recompute_hbm_s for i in remat)
            recompute, recompute_hbm = recompute + g_recompute, recompute_hbm + g_recompute_hbm
            recompute_attention += g.base_recompute_attention_s + sum(
                i.recompute_attention_s for i in remat
            )
            recompute_collective += g.base_recompute_collective_s
            # the matmul seconds back to FLOPs at the rate they were priced at
            recompute_flops += (g_recompute - g_recompute_hbm) * rates.blended_matmul_rate(
                inv.group(g.name).matmul_min_dim_shares
            )
        off = [i for i in mine if placements[(g.name, i.name)] is P.OFFLOAD]
        host += sum(i.bytes for i in off)
        d2h, h2d = sum(i.d2h_s for i in off), sum(i.h2d_s for i in off)
        staged = sum(i.bytes_per_layer for i in off)
        # The layer input offloaded (XLA's host offloader stores the scan's carry residuals: a
        # deviceless compile holds exactly L × the carry in host temp, tests/test_compile.py):
        # its bytes leave the device and cross the link like a named activation's.
        if placements.get((g.name, N.DECODER_LAYER_INPUT)) is P.OFFLOAD:
            act_bytes -= g.base_bytes
            host += g.base_bytes
            d2h += g.base_bytes / rates.d2h_bytes_per_s
            h2d += g.base_bytes / rates.h2d_bytes_per_s
            staged += g.base_bytes // max(1, g.num_layers)
        transfer_total += d2h + h2d
        exposed_d2h += max(0.0, d2h - g.d2h_window_s)
        exposed_h2d += max(0.0, h2d - g.h2d_window_s)
        staging = max(staging, staged_layers * staged)
    sc = state_cost(offloaded_parts(state or {}), prog, rates, grad_accum)
    # The accumulator on the device through the microbatches (A > 1), less what is offloaded.
    accum = accumulator_bytes(prog, grad_accum) - sc.accum_freed_bytes
    # The streamed update's phase: the state left on device, the update's staged slices.
    update_phase = fx.state_bytes - sc.freed_bytes + sc.staging_bytes + fx.fixed_device_bytes
    # The accumulation after a microbatch's backward: its gradients, the accumulator left on
    # device and the offloaded accumulator's layer slices (0 without an offloaded accumulator).
    accum_phase = (
        update_phase - sc.staging_bytes + accum + sc.accum_staging_bytes
        if sc.accum_staging_bytes
        else 0
    )
    micro_phase = act_bytes + staging + fx.fixed_bytes - sc.freed_bytes + accum
    peak = int(max(micro_phase, update_phase, accum_phase))
    # What XLA:TPU assigns (and fits by): the peak without what an older libtpu's memory_analysis()
    # reports beyond its assignment (tierax.costmodel.fixed.FixedTerms.reported_excess_bytes).
    assigned_micro = micro_phase - fx.fixed_bytes + fx.assigned_fixed_bytes
    assigned_peak = int(max(assigned_micro, update_phase, accum_phase))
    # Offloaded state and, during the update, its new values' second host buffer, which shares
    # memory with the offloaded activations (dead by then): tierax.costmodel.state.host_peak.
    act_host = int(host)
    host = host_peak(act_host, sc.host_bytes, sc.accum_host_bytes)
    hidden_copies = transfer_total - exposed_d2h - exposed_h2d
    exposed_coll = exposed_collectives(fx, schedule, recompute, hidden_copies)
    interference = interference_s(
        rates, fx.collective_s - exposed_coll + hidden_copies, fx.compute_s + recompute
    )
    first_touch = first_touch_s(peak, inv, rates)  # CPU only: 0 on GPU and TPU targets
    transpose = transpose_s(placements, inv, rates)  # CPU only: 0 on GPU and TPU targets
    # The update's HBM time runs once per step; everything else of the microbatch A times.
    update_s = hbm.optimizer_bytes(inv.param_bytes) / rates.hbm_bytes_per_s
    exposed = exposed_d2h + exposed_h2d + exposed_coll
    micro = fx.compute_s + recompute + exposed + transpose + interference
    adds = accumulate_s(prog, rates, grad_accum)
    step = (
        (micro if grad_accum == 1 else grad_accum * (micro - update_s) + update_s + adds)
        + first_touch
        + sc.exposed_s
    )
    # The step by resource: the microbatch's parts A times, the update's HBM time once.
    a = grad_accum
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
    breakdown = {
        "state_bytes": fx.state_bytes,
        "state_device_bytes": fx.state_bytes - sc.freed_bytes,
        "activation_bytes": int(act_bytes),
        "activation_host_bytes": act_host,
        "staging_bytes": int(staging),
        "workspace_bytes": fx.workspace_bytes,
        "logits_bytes": fx.logits_bytes,
        "fixed_device_bytes": fx.fixed_device_bytes,
        "stack_copy_bytes": fx.stack_copy_bytes,
        "peak_phase": "update"
        if update_phase > micro_phase and update_phase >= accum_phase
        else "accumulation"
        if accum_phase > micro_phase
        else "loss"
        if fx.loss_phase_bytes > fx.layer_phase_bytes
        else "layer backward",
        "embed_grad_bytes": fx.embed_grad_bytes,
        # Each phase as the peak counts it: offloaded state freed, the accumulator left on device.
        "layer_phase_bytes": int(
            act_bytes + staging + fx.layer_phase_bytes - sc.freed_bytes + accum
        ),
        "loss_phase_bytes": int(act_bytes + staging + fx.loss_phase_bytes - sc.freed_bytes + accum),
        "update_phase_bytes": int(update_phase),
        "accumulation_phase_bytes": int(accum_phase),
        "compute_s": fx.compute_s,
        "hbm_s": fx.hbm_s,
        "fused_attention_s": fx.fused_attention_s,
        "recompute_s": recompute,
        "transfer_s": transfer_total,
        "exposed_d2h_s": exposed_d2h,
        "exposed_h2d_s": exposed_h2d,
        "collective_s": fx.collective_s,
        "exposed_collective_s": exposed_coll,
        "critical_collective_s": fx.critical_collective_s,
        "interference_s": interference,
        "executed_flops": grad_accum * (fx.executed_flops + recompute_flops),
        "recompute_hbm_s": recompute_hbm,
        "first_touch_s": first_touch,
        "transpose_s": transpose,
        "model_flops": fx.model_flops * grad_accum,
        "grad_accum": grad_accum,
        "accumulator_device_bytes": int(accum),
        "accumulate_s": adds,
        "microbatch_s": micro - update_s,
        "update_hbm_s": update_s,
        "schedule": schedule,
        "mechanism": mechanism,
        "rates": rates.sources | network.describe(links, rates),
        "network": {k: v.to_json() for k, v in links.items() if v.link != "none"},
        # what `fits` compares with the limit: the peak XLA:TPU assigns (= the peak elsewhere)
        "assigned_peak_bytes": assigned_peak,
        "reported_excess_bytes": fx.reported_excess_bytes,
        # what `fits` compares the assigned peak with, and what that limit is
        "fit_limit_bytes": rates.usable_device_bytes,
        "fit_limit": (
            "XLA:TPU's HBM limit" if rates.device_limit_bytes else "capacity − runtime reserve"
        ),
        **sc.to_json(),
    }
    return Prediction(
        fits=assigned_peak <= rates.usable_device_bytes and host <= rates.host_memory_bytes,
        peak_device_bytes=peak,
        device_capacity_bytes=rates.device_memory_bytes,
        host_bytes=int(host),
        step_time_s=step,
        tflops_per_device=fx.model_flops * grad_accum / step / 1e12,
        breakdown=breakdown,
        split=split,
    )


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


def keeps_unnamed(placements: dict, group: str, names) -> bool:
    """Whether explicit ``placements`` keep ``group``'s unnamed intermediates (key ``(group,
    UNNAMED)``; absent: recomputed).

    Raises:
      TieraxError: they are kept while a name of the group is not on device.
    """
    P = plan_lib.Placement
    if placements.get((group, plan_lib.UNNAMED), P.REMAT) is not P.DEVICE:
        return False
    other = [n for n in names if placements[(group, n)] is not P.DEVICE]
    if other:
        raise TieraxError(
            f"group {group}: unnamed intermediates kept while {', '.join(other)} are not on device"
        )
    return True


def plan_placements(plan: plan_lib.Plan, program) -> dict:
    """``plan`` as explicit placements ``{(group, name): Placement}``, with ``(group, UNNAMED)``
    for each group's unnamed intermediates (``program``: what the plan is resolved against, a
    :class:`~tierax.tracing.program.Program` or anything with its ``name`` and
    ``layer_groups()``)."""
    out = {
        (g, n): p
        for g, names in plan_lib.resolve(plan, program).items()
        for n, p in names.items()
    }
    unnamed = plan_lib.unnamed_placements(plan, program)
    out.update({(g, plan_lib.UNNAMED): p for g, p in unnamed.items()})
    return out


@accepts_config(1)
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
