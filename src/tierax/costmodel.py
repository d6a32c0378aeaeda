"""Memory and time model of one training step on a target, per device.

Inputs: an :class:`~tierax.inventory.Inventory` (measured from abstract traces), a
Plan, the target's :class:`Rates` and a schedule.  The model is *linear in the
placements* — each activation contributes its own bytes, recompute FLOPs and
transfer time — so the planner can optimise it exactly with an integer program;
:func:`simulate` and the planner share :func:`item_terms` and :func:`fixed_terms`.

Memory (per device): parameters, gradients and AdamW moments (sharded as the
step shards them: fsdp × expert, and tensor where tensor-parallel); activations kept on device (the scan
carry of every layer, plus each ``device`` activation; a group with every
activation on device runs without remat and keeps everything a layer saves,
named or not); staging buffers for transfers (one layer's offloaded slices, two
with XLA's pipelined transfers); one layer's transient workspace (its full residual
set while it is recomputed and back-propagated, a MoE layer's dispatch-sized backward buffers, under FSDP
its gathered weights, and, with an untiled loss, the head's float32 gradient or the logits' gradient it comes
from, kept until the reduce-scatter after the loop); XLA's transposed copies of stacked weights whose FSDP
dimension is not major (live through both loops); the float32 logits.
The peak is the larger of two moments: a layer's backward (the state with every gradient, kept activations,
staging, the transposed copies and one layer's workspace) and the loss (parameters, optimizer state and the
layer gradients, kept activations and staging, the transposed copies, the head's float32 gradient, plus the
float32 logits and their gradient in the compute dtype, or, when the loss is tiled, one tile's gradient and,
under FSDP, the head gathered in the compute dtype).  GPU targets add the fixed buffers
XLA:GPU always allocates (the cuBLAS workspace).  Each term is a buffer seen at deviceless XLA:GPU peaks.

Time: executed matmul FLOPs (forward, 2× for backward, plus recomputation) at the target's achievable
matmul rate, plus the non-matmul work's HBM bytes (:mod:`tierax.hbm`: every layer's forward, backward and
recomputation, the loss, the AdamW update) at the HBM bandwidth, not overlapped with the matmuls (one GPU
stream runs a fusion and a GEMM one after the other); host transfers at the link bandwidth each way,
hidden under compute (matmuls and HBM-bound work) per schedule — ``serial``: none; ``lhs``: up to half of the
same layer's compute; ``lhs-pipelined``: up to the whole neighbouring layer's
compute — under XLA's offload policy; tierax's prefetching scan (a plan's default
mechanism) hides each copy under a whole layer unless the schedule is serial, and
stages one layer beyond the workspace (:func:`staging_and_window`); FSDP all-gathers/reduce-scatters, MoE all-to-alls and tensor-parallel
all-reduces over their mesh axes, each at its link (NVLink inside a domain, the scale-out network
across domains: :mod:`tierax.network`), exposed under ``serial`` and hidden under
compute otherwise; a rematerialised layer repeats its forward's collectives (counted
with its unnamed recomputation, which every remat policy of that group pays).
"""

from __future__ import annotations

import json
import os
import pathlib
from dataclasses import dataclass, field

import jax.numpy as jnp

from tierax import hardware, hbm
from tierax import inventory as inv_lib
from tierax import names as N
from tierax import network
from tierax import plan as plan_lib
from tierax.errors import TieraxError
from tierax.inventory import Inventory
from tierax.models import moe
from tierax.models.flops import train_flops
from tierax.train import gather_layout

SCHEDULES = ("serial", "lhs", "lhs-pipelined")
STAGING_LAYERS = {"serial": 1, "lhs": 1, "lhs-pipelined": 2}
OVERLAP_WINDOW = {"serial": 0.0, "lhs": 0.5, "lhs-pipelined": 1.0}


def staging_and_window(schedule: str, mechanism: str) -> tuple[int, float]:
    """(layers of offloaded residuals staged on device, share of a layer's compute a copy can hide under).

    ``policy`` (XLA's host offloader): as the schedule allows.  ``prefetch`` (tierax's scan): a store overlaps
    the rest of the forward, a load the whole backward of the layer before its use, so a whole layer unless
    serial; one layer staged, the one arriving: the layer in use's loaded slices are its residuals, already in
    the workspace (its save-all residual set).  XLA's peak, in a layer's backward, holds those and the next
    one's prefetched slices (two layers overstated DeepSeek-V3 deepseek-offload by +9.3 %, 5 layers by +3.6 %).
    """
    if mechanism == "prefetch":
        return 1, (0.0 if schedule == "serial" else 1.0)
    return STAGING_LAYERS[schedule], OVERLAP_WINDOW[schedule]


# H200: ≈790 TFLOP/s measured bf16 matmul of 989 peak (DESIGN.md) → 0.8, used for every GPU
# target until `tierax calibrate` measures the device at hand.
ACHIEVABLE_FRACTION = 0.8
# XLA:GPU's cuBLAS workspace, an s8[4194304] buffer in every deviceless GPU compile's peak set (seen with
# jaxlib 0.10.2 from tiny-llama to DeepSeek-V3; the live-range dump lists it at the peak).
XLA_GPU_FIXED_BYTES = 4 * 2**20
CALIBRATION_FILE = pathlib.Path(os.environ.get("TIERAX_CALIBRATION", pathlib.Path.home() / ".cache" / "tierax" / "calibration.json"))


@dataclass(frozen=True)
class Rates:
    """The constants of the model for one target, each with where it came from."""

    target: str
    matmul_flops_per_s: float
    hbm_bytes_per_s: float
    d2h_bytes_per_s: float
    h2d_bytes_per_s: float
    interconnect_bytes_per_s: float
    device_memory_bytes: int
    host_memory_bytes: int
    offload_is_real: bool
    sources: dict = field(default_factory=dict)
    fixed_device_bytes: int = 0  # buffers the compiler allocates whatever the model (XLA:GPU's cuBLAS workspace)
    # Collectives whose group leaves an NVLink (ICI) domain run at the scale-out rate (tierax.network);
    # nvlink_domain_gpus 0: one domain holds every device; gpus_per_domain 0: spread evenly (network.py).
    nvlink_domain_gpus: int = 0
    scale_out_bytes_per_s: float = 0.0
    gpus_per_domain: int = 0


def load_calibration() -> dict:
    if CALIBRATION_FILE.exists():
        try:
            return json.loads(CALIBRATION_FILE.read_text())
        except json.JSONDecodeError:
            raise TieraxError(f"{CALIBRATION_FILE} is not valid JSON; delete it and run `tierax calibrate` again") from None
    return {}


def target_rates(target: str, dtype: str) -> Rates:
    """Rates for a GPU target from the hardware table (or measured calibration), or ``cpu`` measured here."""
    cal = load_calibration().get(target, {})
    if target == "cpu":
        if "matmul_flops_per_s" not in cal:
            raise TieraxError("target 'cpu' needs a measured matmul rate: run `tierax calibrate` first")
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return Rates("cpu", cal["matmul_flops_per_s"], cal.get("memory_bytes_per_s", 10e9), 1.0, 1.0, 1.0,
                     mem, mem, False, {"matmul": f"measured by tierax calibrate ({cal.get('created', '?')})",
                                        "memory": "physical RAM", "offload": "a no-op on XLA:CPU"})
    spec = hardware.get_target(target)
    peak = spec.peak(dtype)
    matmul = cal.get(f"matmul_flops_per_s_{dtype}", peak * ACHIEVABLE_FRACTION)
    d2h = cal.get("d2h_bytes_per_s", spec.host_link_bps)
    h2d = cal.get("h2d_bytes_per_s", spec.host_link_bps)
    measured = f"measured by tierax calibrate ({cal.get('created', '?')})"
    sources = {
        "matmul": measured if f"matmul_flops_per_s_{dtype}" in cal
        else f"{ACHIEVABLE_FRACTION:.0%} of the {peak / 1e12:.0f} TFLOP/s {dtype} datasheet peak (H200 measured 790/989)",
        "host_link": measured if "d2h_bytes_per_s" in cal else spec.host_link_source,
        "hbm": "XLA device spec", "interconnect": "NVLink datasheet, per direction",
        "scale_out": spec.scale_out_source, "nvlink_domain": f"{spec.nvlink_domain_gpus} devices per NVLink/ICI domain",
        "memory": "XLA device spec", "host_memory": "system datasheet, per GPU",
    } | getattr(spec, "rate_sources", {})  # TPU targets name their own sources
    fixed = XLA_GPU_FIXED_BYTES if spec.kind == "gpu" else 0
    return Rates(target, matmul, spec.hbm_bytes_per_s, d2h, h2d, spec.nvlink_bytes_per_s,
                 spec.device_memory_bytes, int(spec.host_memory_per_gpu_bytes), True, sources, fixed,
                 spec.nvlink_domain_gpus, spec.scale_out_bytes_per_s)


def forward_collective_s(g, links: dict) -> float:
    """Seconds one layer of group ``g`` spends in its forward's collectives, each axis at its own link."""
    by_axis = dict(g.forward_collective_bytes_by_axis)
    rest = g.forward_collective_bytes_per_layer - sum(by_axis.values())  # bytes with no axis (an API inventory)
    return sum(b / links[a].bytes_per_s for a, b in by_axis.items()) + max(0.0, rest) / links["tensor"].bytes_per_s


@dataclass(frozen=True)
class ItemTerms:
    """What one (group, activation) costs under each placement, per device per step."""

    group: str
    name: str
    bytes: int  # all layers
    bytes_per_layer: int
    recompute_s: float  # if remat
    d2h_s: float  # if offloaded, per step (all layers)
    h2d_s: float
    recompute_hbm_s: float = 0.0  # the part of recompute_s that is non-matmul work at HBM bandwidth


@dataclass(frozen=True)
class GroupTerms:
    name: str
    num_layers: int
    base_bytes: int  # carry of every layer (kept under any plan)
    save_all_extra_bytes: int  # extra when the group runs with no remat (every activation on device)
    base_recompute_s: float  # unnamed recomputation under any remat policy
    fwd_s: float  # all layers
    bwd_s: float  # all layers, without recomputation
    d2h_window_s: float  # compute a group's stores can hide under (all layers)
    h2d_window_s: float
    base_recompute_hbm_s: float = 0.0  # the part of base_recompute_s that is non-matmul work at HBM bandwidth


@dataclass(frozen=True)
class FixedTerms:
    state_bytes: int
    workspace_bytes: int
    logits_bytes: int  # at the loss: logits (float32), their gradient (compute dtype), the LM head's float32 gradient
    compute_s: float  # forward + backward matmuls, head included, no recompute, plus hbm_s
    collective_s: float
    exposed_collective_s: float
    model_flops: float  # MaxText convention, per device
    executed_flops: float  # without recomputation, per device
    embed_grad_bytes: int = 0  # the embedding's and head's (sharded) gradients: not yet written at the loss
    fixed_device_bytes: int = 0
    stack_copy_bytes: int = 0  # XLA's transposed copies of stacked weights: live from the forward loop to the backward's end
    hbm_s: float = 0.0  # non-matmul work at HBM bandwidth (tierax.hbm), no recompute: part of compute_s

    @property
    def layer_phase_bytes(self) -> int:
        """Plan-independent bytes while a layer is back-propagated (add kept activations and staging)."""
        return self.state_bytes + self.workspace_bytes + self.stack_copy_bytes + self.fixed_device_bytes

    @property
    def loss_phase_bytes(self) -> int:
        """Plan-independent bytes at the loss (add kept activations and staging)."""
        return (self.state_bytes - self.embed_grad_bytes + self.logits_bytes + self.stack_copy_bytes
                + self.fixed_device_bytes)

    @property
    def fixed_bytes(self) -> int:
        """Peak bytes without the plan's activations and staging (the larger phase)."""
        return max(self.layer_phase_bytes, self.loss_phase_bytes)


def item_terms(inv: Inventory, rates: Rates, mechanism: str = plan_lib.DEFAULT_MECHANISM) -> list[ItemTerms]:
    """Per offloadable activation: bytes, recompute seconds, store and load seconds.

    Under ``prefetch`` the backward loads one layer more than it stores: its last iteration
    re-reads layer 0 (the copy issued for a layer −1 that does not exist; no branch in the loop).
    """
    spare = 1 if mechanism == "prefetch" else 0
    out = []
    for g in inv.groups:
        for a in g.activations:
            if a.name == N.DECODER_LAYER_INPUT:
                continue  # the scan carry: always on device (counted in GroupTerms.base_bytes)
            out.append(ItemTerms(g.name, a.name, a.total_bytes, a.bytes_per_layer,
                                 (a.recompute_flops_per_layer / rates.matmul_flops_per_s
                                  + a.recompute_hbm_bytes_per_layer / rates.hbm_bytes_per_s) * g.num_layers,
                                 a.total_bytes / rates.d2h_bytes_per_s,
                                 (a.total_bytes + spare * a.bytes_per_layer) / rates.h2d_bytes_per_s,
                                 a.recompute_hbm_bytes_per_layer * g.num_layers / rates.hbm_bytes_per_s))
    return out


def group_terms(inv: Inventory, rates: Rates, schedule: str,
                mechanism: str = plan_lib.DEFAULT_MECHANISM) -> list[GroupTerms]:
    w = staging_and_window(schedule, mechanism)[1]
    links = network.axis_links(inv.mesh, rates)
    out = []
    for g in inv.groups:
        L = g.num_layers
        named = sum(a.bytes_per_layer for a in g.activations if a.name != N.DECODER_LAYER_INPUT)
        mm, hb = rates.matmul_flops_per_s, rates.hbm_bytes_per_s
        fwd = (g.forward_flops_per_layer / mm + g.forward_hbm_bytes_per_layer / hb) * L
        bwd = (2 * g.forward_flops_per_layer / mm + g.backward_hbm_bytes_per_layer / hb) * L
        base = (g.base_recompute_flops_per_layer / mm + g.base_recompute_hbm_bytes_per_layer / hb) * L
        # A rematerialised layer repeats its forward: its matmuls, its HBM-bound work and its collectives
        # (the MoE dispatch/combine all-to-alls, the tensor-parallel all-reduces).
        repeat = base + forward_collective_s(g, links) * L
        out.append(GroupTerms(
            g.name, L, g.carry_bytes_per_layer * L,
            (g.save_all_bytes_per_layer - g.carry_bytes_per_layer - named) * L,
            repeat,
            fwd, bwd, w * fwd, w * (bwd + base), g.base_recompute_hbm_bytes_per_layer * L / hb,
        ))
    return out


def fixed_terms(inv: Inventory, cfg, rates: Rates, schedule: str) -> FixedTerms:
    c_item = jnp.dtype(cfg.dtype).itemsize
    tokens = inv.microbatch * inv.seq
    head_flops = 2.0 * tokens * cfg.d_model * cfg.vocab_size
    tiled = getattr(cfg, "loss_tiles", 1) > 1  # the backward recomputes each tile's logits (a head forward)
    loss_recompute = head_flops if tiled else 0.0
    executed = 3.0 * (sum(g.forward_flops_per_layer * g.num_layers for g in inv.groups) + head_flops) + loss_recompute
    hbm_s = hbm.step_fixed_bytes(inv) / rates.hbm_bytes_per_s  # non-matmul work, not overlapped with matmuls
    compute_s = executed / rates.matmul_flops_per_s + hbm_s
    # Weights: FSDP-sharded over fsdp × expert (experts: E over expert, the rest over fsdp), split over tensor
    # where tensor-parallel (the inventory traces a layer per tensor shard already).
    fsdp = inv.mesh.get("fsdp", 1) * inv.mesh.get("expert", 1)
    # One layer in flight: its residuals while it is recomputed and back-propagated, a MoE layer's backward
    # buffers of the dispatch's size (tierax.models.moe), and, under FSDP, its weights gathered in the compute
    # dtype: the dense ones whole (per tensor shard), the expert ones over fsdp only (E / expert local experts).
    ep = inv.mesh.get("expert", 1)
    p_item = jnp.dtype(cfg.param_dtype).itemsize
    head_grad = cfg.vocab_size * cfg.d_model * p_item  # the LM head's gradient, unsharded [D, V]
    grad_share = 1.0 if rates.target in hardware.TPU_TARGETS else c_item / 4  # logits' gradient ÷ logits
    workspace = max(
        g.save_all_bytes_per_layer
        + (c_item * (g.layer_param_count - g.expert_param_count_per_layer) if fsdp > 1 else 0)
        + (c_item * g.expert_param_count_per_layer / ep if inv.mesh.get("fsdp", 1) > 1 else 0)
        + (moe.backward_buffer_bytes(cfg, tokens, ep) if g.expert_param_count_per_layer else 0) for g in inv.groups
    )
    # XLA's transposed copies of stacked weights it cannot gather along their major dimension
    # (tierax.train.gather_layout): made before the forward loop, live at the loss and through the
    # backward loop (llama3.1-405b fsdp=128: wi_0, wi_1, 2 × 3.4 GB; DeepSeek-V3: the experts' weights).
    stack_copy = p_item * gather_layout.transposed_stack_params(cfg, inv.mesh)
    if fsdp > 1 and cfg.vocab_size and not tiled:
        # The head's backward runs before the layers': until the reduce-scatter after the loop, XLA keeps
        # either its float32 weight gradient ([D, V], unsharded) or the logits' gradient (compute dtype) it is
        # computed from ([tokens, V]), whichever it schedules (405B fsdp=128: the first; fsdp=1024: the
        # second); the model counts the smaller.  A tiled loss reduce-scatters each tile's head gradient in
        # its scan (llama3-8b, DeepSeek-V3).  The gathered embedding and head are free during the loop.
        workspace += min(head_grad, int(inv.logits_bytes * grad_share))
    coll = 0.0
    links = network.axis_links(inv.mesh, rates)
    # FSDP: AG fwd, AG bwd, RS grads, each weight class over its own group at that group's link (scale-out
    # if it leaves a domain).  Routed experts are sharded E over expert and D over fsdp: a device gathers
    # its E / expert local experts over fsdp alone (tierax.train.sharding, tierax.models.moe); the other
    # weights over fsdp × expert.  Per-device parameters = the dense ones' shard + the experts' shard.
    n_fsdp = inv.mesh.get("fsdp", 1)
    n_efsdp = n_fsdp if n_fsdp > 1 and getattr(cfg, "d_model", 0) % n_fsdp == 0 else 1  # D not divisible: kept whole
    expert_local = sum(g.expert_param_count_per_layer * g.num_layers for g in inv.groups) / (ep * n_efsdp)
    if fsdp > 1:
        gathered = (inv.param_bytes / jnp.dtype(cfg.param_dtype).itemsize - expert_local) * c_item * fsdp
        coll += 3 * gathered * (fsdp - 1) / fsdp / links[network.FSDP_GROUP].bytes_per_s
    if n_efsdp > 1 and expert_local:
        gathered = expert_local * c_item * n_efsdp
        coll += 3 * gathered * (n_efsdp - 1) / n_efsdp / links["fsdp"].bytes_per_s
    # Expert-parallel all-to-alls (over expert) and tensor-parallel all-reduces (over tensor): the forward's,
    # and as much again in the backward (a rematerialised layer's repeat is in GroupTerms.base_recompute_s).
    coll += sum(2 * forward_collective_s(g, links) * g.num_layers for g in inv.groups)
    exposed_coll = coll if schedule == "serial" else max(0.0, coll - compute_s)
    # At the loss (deviceless XLA:GPU peaks): untiled, the head's float32 gradient [D, V], the float32 logits
    # and their gradient in the compute dtype (llama3-8b fsdp=8, fsdp=4,tensor=2); tiled, one tile's gradient,
    # two float32 [D, V] (the head-gradient accumulator in and out; one under FSDP in a narrower dtype: the
    # other was the head in float32 for a float32 gradient, llama3-8b 4 tiles fsdp=8: XLA 10.22 -> 7.76 GiB)
    # and under FSDP the gathered head.  XLA:TPU's peak did not fall with a bfloat16 gradient
    # (tests/test_tpu.py's v5p plan: 144.67 MB both ways), so TPU targets count it as float32.
    loss_bytes = head_grad + inv.logits_bytes * (1 + grad_share)
    if tiled:
        narrow = fsdp > 1 and grad_share < 1
        loss_bytes = ((1 if narrow else 2) * head_grad + inv.logits_bytes * grad_share
                      + (cfg.vocab_size * cfg.d_model * c_item if fsdp > 1 else 0))
    if not cfg.vocab_size:  # a model without a head (tierax.api): logits_bytes are the caller's, live throughout
        workspace += inv.logits_bytes
        loss_bytes = inv.logits_bytes
    return FixedTerms(
        state_bytes=inv.param_bytes + inv.grad_bytes + inv.optimizer_bytes, workspace_bytes=int(workspace),
        logits_bytes=int(loss_bytes), compute_s=compute_s, collective_s=coll, exposed_collective_s=exposed_coll,
        model_flops=train_flops(cfg, inv.microbatch, inv.seq), executed_flops=executed,
        embed_grad_bytes=int(inv.embed_param_count * p_item / fsdp), fixed_device_bytes=rates.fixed_device_bytes,
        stack_copy_bytes=int(stack_copy), hbm_s=hbm_s,
    )


@dataclass(frozen=True)
class Prediction:
    fits: bool
    peak_device_bytes: int
    device_capacity_bytes: int
    host_bytes: int
    step_time_s: float
    tflops_per_device: float
    breakdown: dict

    def to_json(self) -> dict:
        return {
            "fits": self.fits, "peak_device_bytes": self.peak_device_bytes,
            "device_capacity_bytes": self.device_capacity_bytes, "host_bytes": self.host_bytes,
            "step_time_s": self.step_time_s, "tflops_per_device": self.tflops_per_device, "breakdown": self.breakdown,
        }


def evaluate(placements: dict, inv: Inventory, cfg, rates: Rates, schedule: str,
             mechanism: str = plan_lib.DEFAULT_MECHANISM) -> Prediction:
    """The model for explicit placements ``{(group, name): Placement}`` (carry names may be omitted)."""
    if schedule not in SCHEDULES:
        raise TieraxError(f"unknown schedule {schedule!r}; choose one of: {', '.join(SCHEDULES)}")
    P = plan_lib.Placement
    items = item_terms(inv, rates, mechanism)
    groups = group_terms(inv, rates, schedule, mechanism)
    staged_layers = staging_and_window(schedule, mechanism)[0]
    fx = fixed_terms(inv, cfg, rates, schedule)
    links = network.axis_links(inv.mesh, rates)
    if not rates.offload_is_real:  # XLA:CPU keeps "offloaded" values on device
        placements = {k: (P.DEVICE if v is P.OFFLOAD else v) for k, v in placements.items()}
    act_bytes = host = 0
    recompute = recompute_hbm = exposed_d2h = exposed_h2d = transfer_total = staging = 0.0
    for g in groups:
        mine = [i for i in items if i.group == g.name]
        no_remat = all(placements[(g.name, i.name)] is P.DEVICE for i in mine)
        act_bytes += g.base_bytes + sum(i.bytes for i in mine if placements[(g.name, i.name)] is P.DEVICE)
        if no_remat:
            act_bytes += g.save_all_extra_bytes
        else:
            remat = [i for i in mine if placements[(g.name, i.name)] is P.REMAT]
            recompute += g.base_recompute_s + sum(i.recompute_s for i in remat)
            recompute_hbm += g.base_recompute_hbm_s + sum(i.recompute_hbm_s for i in remat)
        off = [i for i in mine if placements[(g.name, i.name)] is P.OFFLOAD]
        host += sum(i.bytes for i in off)
        d2h, h2d = sum(i.d2h_s for i in off), sum(i.h2d_s for i in off)
        transfer_total += d2h + h2d
        exposed_d2h += max(0.0, d2h - g.d2h_window_s)
        exposed_h2d += max(0.0, h2d - g.h2d_window_s)
        staging = max(staging, staged_layers * sum(i.bytes_per_layer for i in off))
    peak = int(act_bytes + staging + fx.fixed_bytes)
    step = fx.compute_s + recompute + exposed_d2h + exposed_h2d + fx.exposed_collective_s
    breakdown = {
        "state_bytes": fx.state_bytes, "activation_bytes": int(act_bytes), "staging_bytes": int(staging),
        "workspace_bytes": fx.workspace_bytes, "logits_bytes": fx.logits_bytes,
        "fixed_device_bytes": fx.fixed_device_bytes, "stack_copy_bytes": fx.stack_copy_bytes,
        "peak_phase": "loss" if fx.loss_phase_bytes > fx.layer_phase_bytes else "layer backward",
        "compute_s": fx.compute_s, "hbm_s": fx.hbm_s, "recompute_s": recompute, "transfer_s": transfer_total,
        "exposed_d2h_s": exposed_d2h, "exposed_h2d_s": exposed_h2d,
        "collective_s": fx.collective_s, "exposed_collective_s": fx.exposed_collective_s,
        "executed_flops": fx.executed_flops + (recompute - recompute_hbm) * rates.matmul_flops_per_s,
        "recompute_hbm_s": recompute_hbm,
        "model_flops": fx.model_flops, "schedule": schedule, "mechanism": mechanism,
        "rates": rates.sources | network.describe(links, rates),
        "network": {k: v.to_json() for k, v in links.items() if v.link != "none"},
    }
    return Prediction(
        fits=peak <= hardware.usable_bytes(rates.device_memory_bytes) and host <= rates.host_memory_bytes,
        peak_device_bytes=peak, device_capacity_bytes=rates.device_memory_bytes, host_bytes=int(host),
        step_time_s=step, tflops_per_device=fx.model_flops / step / 1e12, breakdown=breakdown,
    )


def plan_placements(plan: plan_lib.Plan, cfg) -> dict:
    return {(g, n): p for g, names in plan_lib.resolve(plan, cfg).items() for n, p in names.items()}


def simulate(plan: plan_lib.Plan, inv: Inventory, cfg, rates: Rates, schedule: str) -> Prediction:
    """Predicted peak device bytes, host bytes and step time of ``plan``."""
    inv = inv_lib.for_plan(inv, plan, cfg)  # a segmented group: one scan, and one row, per segment
    return evaluate(plan_placements(plan, cfg), inv, cfg, rates, schedule, plan.mechanism)
