"""The plan-independent terms of a step (:class:`FixedTerms`): compute time, workspace, transposed
weight
copies, collectives and the loss phase's bytes."""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp

from tierax import hardware
from tierax.costmodel import network
from tierax.costmodel.rates import (
    FUSED_BACKWARD_FLOPS_RATIO,
    Rates,
    for_program,
    indexed_s,
    matmul_s,
)
from tierax.hardware import cudnn, libtpu
from tierax.tracing import hbm
from tierax.tracing.inventory import Inventory
from tierax.tracing.model_program import takes_program
from tierax.tracing.model_program import transposed_stack_params as transposed_stack_params
from tierax.tracing.program import Head, Program


@dataclass(frozen=True)
class FixedTerms:
    state_bytes: int
    workspace_bytes: int
    # at the loss: logits (float32), their gradient (compute dtype), the LM head's float32 gradient
    logits_bytes: int
    compute_s: float  # forward + backward matmuls, head included, no recompute, plus hbm_s
    collective_s: float
    # exposed with compute alone to hide under (no recompute, no host copies): what a plan's
    # prediction starts from (tierax.costmodel.predict shares the window with the copies)
    exposed_collective_s: float
    model_flops: float  # MaxText convention, per device
    executed_flops: float  # without recomputation, per device
    # Of collective_s, the part the layers wait for: tensor-parallel all-reduces and expert-parallel
    # all-to-alls (a layer's next matmul reads their result); the rest (FSDP gathers and
    # reduce-scatters, the data all-reduce) is issued ahead or behind and hides under compute.
    critical_collective_s: float = 0.0
    # gradients not yet written at the loss (GPU: the embedding's and head's; TPU: all)
    embed_grad_bytes: int = 0
    fixed_device_bytes: int = 0
    # XLA's transposed copies of stacked weights: live from the forward loop to the backward's end
    stack_copy_bytes: int = 0
    hbm_s: float = (
        0.0  # non-matmul work at HBM bandwidth (tierax.tracing.hbm), no recompute: in compute_s
    )
    fused_attention_s: float = (
        0.0  # fused attention kernels, forward and backward, no recompute: part of compute_s
    )
    # All device bytes live after the layers' backward where the program holds more then (its front
    # end's Program.after_backward_bytes; 0: no such phase): counted in the layer phase.
    after_backward_bytes: int = 0
    # What the installed libtpu's memory_analysis() reports at the loss beyond XLA:TPU's own buffer
    # assignment (libtpu_temp_excess_bytes): counted in logits_bytes, so the peak matches what a
    # compile reports, but not a buffer — XLA:TPU fits a program by its assignment.
    reported_excess_bytes: int = 0
    # Of the state's gradients, those the program writes only after the layers' backward (its
    # front end's Program.late_grad_bytes): not counted in the layer phase.
    late_grad_bytes: int = 0
    # Each layer group's workspace ((group, bytes), workspace_bytes the largest): the layer phase
    # of each group's backward, which on a TPU the names a plan keeps lower
    # (tierax.costmodel.kept_reads).  Empty: one layer phase, workspace_bytes.
    group_workspace_bytes: tuple = ()

    def layer_backward_bytes(self, workspace: int) -> int:
        """Plan-independent bytes while a layer with ``workspace`` is back-propagated."""
        return (
            self.state_bytes
            - self.late_grad_bytes
            + workspace
            + self.stack_copy_bytes
            + self.fixed_device_bytes
        )

    @property
    def layer_phase_bytes(self) -> int:
        """Plan-independent bytes while a layer is back-propagated (add kept activations and
        staging)."""
        return max(
            self.layer_backward_bytes(self.workspace_bytes),
            self.after_backward_bytes + self.fixed_device_bytes if self.after_backward_bytes else 0,
        )

    @property
    def loss_phase_bytes(self) -> int:
        """Plan-independent bytes at the loss (add kept activations and staging)."""
        return (
            self.state_bytes
            - self.embed_grad_bytes
            + self.logits_bytes
            + self.stack_copy_bytes
            + self.fixed_device_bytes
        )

    @property
    def fixed_bytes(self) -> int:
        """Peak bytes without the plan's activations and staging (the larger phase)."""
        return max(self.layer_phase_bytes, self.loss_phase_bytes)

    @property
    def assigned_fixed_bytes(self) -> int:
        """:attr:`fixed_bytes` as XLA:TPU assigns them: without :attr:`reported_excess_bytes`."""
        return max(self.layer_phase_bytes, self.loss_phase_bytes - self.reported_excess_bytes)


def _compute(prog: Program, rates: Rates, tiled: bool) -> tuple[float, float, float, float]:
    inv = prog.inventory
    head_flops = 2.0 * prog.tokens * prog.head.params if prog.head else 0.0
    loss_recompute = head_flops if tiled else 0.0
    executed = (
        3.0 * (sum(g.forward_flops_per_layer * g.num_layers for g in inv.groups) + head_flops)
        + loss_recompute
    )
    # non-matmul work, not overlapped with matmuls: the bytes at HBM bandwidth, and the layers'
    # gathers and scatters beyond them where the target prices those (terms.indexed_s)
    hbm_s = hbm.step_fixed_bytes(inv) / rates.hbm_bytes_per_s + sum(
        (
            indexed_s(g.forward_indexed_per_layer, rates)
            + indexed_s(g.backward_indexed_per_layer, rates)
        )
        * g.num_layers
        for g in inv.groups
    )
    # fp8 GEMMs (quantization: fp8): the traced share of each layer's forward matmul FLOPs whose
    # operands are fp8, forward and backward, at the target's fp8 rate (none: the compute dtype's
    # rate, as emulated fp8 runs)
    # (each group's at the fp8 rate its GEMMs' sizes give: Rates.blended_fp8_rate)
    fp8 = fp8_s = 0.0
    if getattr(rates, "fp8_matmul_flops_per_s", 0.0) > 0:
        for g in inv.groups:
            f = 3.0 * g.fp8_flops_share * g.forward_flops_per_layer * g.num_layers
            fp8 += f
            fp8_s += f / rates.blended_fp8_rate(g.matmul_min_dim_shares) if f else 0.0
    # The LM head's GEMMs (forward, its two gradients, a tiled loss's recomputed forward) at the
    # head's own rate where the target has one (XLA:CPU: Rates.head_matmul_flops_per_s).
    head = 3.0 * head_flops + loss_recompute if rates.head_matmul_flops_per_s > 0 else 0.0
    head_s = head / rates.head_matmul_flops_per_s if head else 0.0
    # A fused attention kernel's matmuls run at its own rates, its backward doing 2.5 × its
    # forward's FLOPs.
    fused = sum(g.fused_attention_flops_per_layer * g.num_layers for g in inv.groups)
    # The other GEMMs: each group's at the rate its GEMMs' smallest dimensions give
    # (Rates.blended_matmul_rate; one matmul rate where the target has no rates by size), the
    # head's where it has no rate of its own at the matmul rate.
    layers_s = sum(
        3.0
        * g.num_layers
        * (
            g.forward_flops_per_layer * (1.0 - g.fp8_flops_share if fp8 else 1.0)
            - g.fused_attention_flops_per_layer
        )
        / rates.blended_matmul_rate(g.matmul_min_dim_shares)
        for g in inv.groups
    )
    head_rest_s = (3.0 * head_flops + loss_recompute - head) / rates.matmul_flops_per_s
    fused_s = (
        matmul_s(fused, fused, rates) + matmul_s(fused, fused, rates, backward=True)
        if fused
        else 0.0
    )
    executed += (1 + FUSED_BACKWARD_FLOPS_RATIO - 3.0) * fused
    compute_s = layers_s + head_rest_s + fp8_s + head_s + fused_s + hbm_s
    return executed, hbm_s, compute_s, fused_s


def _workspace(
    prog: Program,
    per_group: dict,
    fsdp: int,
    tiled: bool,
    head_grad: int,
    grad_share: float,
) -> float:
    # One layer in flight, the largest group's (per_group: each group's, _group_workspace): its
    # residuals while it is recomputed and back-propagated (TPU: those XLA:TPU writes,
    # tierax.tracing.hbm.written_residual_bytes), a MoE layer's backward buffers
    # (Program.moe_backward_bytes: the dispatch's size, tierax.models.moe; front ends list only
    # routed-expert groups, whether or not their trace counts expert parameters apart), and, under
    # FSDP, its weights gathered in the compute dtype: the dense ones whole (per tensor shard), the
    # expert ones over fsdp only (E / expert local experts).
    inv = prog.inventory
    workspace = max(per_group.values())
    att = prog.attention
    if att is not None and att.kind == "cudnn":
        # cuDNN's attention backward workspace, one layer's at a time (tierax.hardware.cudnn): XLA's
        # deviceless compile counts it as 0, a real GPU allocates it.
        workspace += cudnn.backward_workspace_bytes(
            inv.microbatch, att.heads_per_device, inv.seq, att.qk_head_dim
        )
    if fsdp > 1 and prog.head and not tiled:
        # The head's backward runs before the layers': until the reduce-scatter after the loop, XLA
        # keeps either its float32 weight gradient ([D, V], unsharded) or the logits' gradient
        # (compute dtype) it is computed from ([tokens, V]), whichever it schedules (both are seen
        # in bench/compile_grid.py --scale-dense's cases); the model counts the smaller.  A tiled
        # loss reduce-scatters each tile's head gradient in its scan (llama3-8b, DeepSeek-V3).  The
        # gathered embedding and head are free during the loop.
        # TPU targets pass grad_share 0: XLA:TPU's peak in the layer loop holds neither
        # (_tpu_loss_phase_bytes).
        workspace += min(head_grad, int(inv.logits_bytes * grad_share))
    return workspace


def _group_workspace(prog: Program, c_item: int, fsdp: int, ep: int, tpu: bool) -> dict:
    """Each group's one layer in flight (:func:`_workspace`), before what every group shares."""
    inv = prog.inventory
    # the routed experts gathered: the layer's E / expert local experts, or what the front end
    # knows one layer's backward holds of them (Program.gathered_expert_bytes); the other weights
    # gathered whole, or what the front end knows of them (Program.gathered_weight_bytes: a
    # scanned block's backward gathering one of its layers at a time)
    known = dict(prog.gathered_expert_bytes)
    dense = dict(prog.gathered_weight_bytes)
    return {
        g.name: (g.written_residual_bytes_per_layer if tpu else g.save_all_bytes_per_layer)
        + (
            dense.get(
                g.name.partition("@")[0],
                c_item * (g.layer_param_count - g.expert_param_count_per_layer),
            )
            if fsdp > 1
            else 0
        )
        + (
            known.get(g.name, c_item * g.expert_param_count_per_layer / ep)
            if inv.mesh.get("fsdp", 1) > 1
            else 0
        )
        + prog.moe_backward(g.name)
        for g in inv.groups
    }


def _stack_copy_bytes(prog: Program, p_item: int) -> int:
    # XLA's transposed copies of stacked weights it cannot gather along their major dimension
    # (tierax.sharding.gather_layout): made before the forward loop, live at the loss and through
    # the backward loop (tierax.sharding.gather_layout names the stacks).
    return p_item * prog.stack_copy_params


@takes_program(0)
def collective_s_by_group(prog: Program, rates: Rates) -> dict[str, float]:
    """Seconds of collectives per step, per collective group (a mesh axis, or the FSDP group
    ``fsdp×expert``), each at its group's link (:mod:`tierax.costmodel.network`)."""
    out = dict(_hideable_collective_s(prog, rates))
    for a, s in _critical_collective_s(prog.inventory, rates).items():
        out[a] = out.get(a, 0.0) + s
    return out


def _hideable_collective_s(prog: Program, rates: Rates) -> dict[str, float]:
    """FSDP's gathers and reduce-scatters and the data all-reduce, per group."""
    inv = prog.inventory
    c_item = jnp.dtype(prog.dtype).itemsize
    ep = inv.mesh.get("expert", 1)
    fsdp = inv.mesh.get("fsdp", 1) * ep
    out: dict[str, float] = {}
    links = network.axis_links(inv.mesh, rates)
    # FSDP: AG fwd, AG bwd, RS grads, each weight class over its own group at that group's link
    # (scale-out if it leaves a domain).  Routed experts are sharded E over expert and D over fsdp:
    # a device gathers its E / expert local experts over fsdp alone (tierax.sharding.rules,
    # tierax.models.moe); the other weights over fsdp × expert.  Per-device parameters = the dense
    # ones' shard + the experts' shard.
    n_fsdp = inv.mesh.get("fsdp", 1)
    n_efsdp = n_fsdp if n_fsdp > 1 and prog.hidden % n_fsdp == 0 else 1  # D not divisible: whole
    expert_local = sum(g.expert_param_count_per_layer * g.num_layers for g in inv.groups) / (
        ep * n_efsdp
    )
    if fsdp > 1:
        gathered = (
            (inv.param_bytes / jnp.dtype(prog.param_dtype).itemsize - expert_local) * c_item * fsdp
        )
        out[network.FSDP_GROUP] = (
            3 * gathered * (fsdp - 1) / fsdp / links[network.FSDP_GROUP].bytes_per_s
        )
    if n_efsdp > 1 and expert_local:
        gathered = expert_local * c_item * n_efsdp
        out["fsdp"] = 3 * gathered * (n_efsdp - 1) / n_efsdp / links["fsdp"].bytes_per_s
    # Data parallelism: each device's gradient shard all-reduced over data (ring: 2(n−1)/n of it
    # sent), once per step, in the parameter dtype the gradients have.
    n_data = inv.mesh.get("data", 1)
    if n_data > 1:
        out["data"] = 2 * inv.grad_bytes * (n_data - 1) / n_data / links["data"].bytes_per_s
    return out


def _critical_collective_s(inv: Inventory, rates: Rates) -> dict[str, float]:
    """Expert-parallel all-to-alls (over expert) and tensor-parallel all-reduces (over tensor), per
    axis: the forward's, and as much again in the backward (a rematerialised layer's repeat is in
    GroupTerms.base_recompute_s)."""
    links = network.axis_links(inv.mesh, rates)
    out: dict[str, float] = {}
    for g in inv.groups:
        by_axis = dict(g.forward_collective_bytes_by_axis)
        rest = max(0.0, g.forward_collective_bytes_per_layer - sum(by_axis.values()))
        if rest:  # bytes with no axis (an API inventory): over tensor, as forward_collective_s
            by_axis["tensor"] = by_axis.get("tensor", 0.0) + rest
        for a, b in by_axis.items():
            out[a] = out.get(a, 0.0) + 2 * b / links[a].bytes_per_s * g.num_layers
    return out


def _collectives(
    prog: Program, rates: Rates, schedule: str, compute_s: float
) -> tuple[float, float, float]:
    """(all collectives' seconds, exposed with ``compute_s`` to hide under, the critical part)."""
    hideable = sum(_hideable_collective_s(prog, rates).values())
    critical = sum(_critical_collective_s(prog.inventory, rates).values())
    return hideable + critical, critical + exposed_share(hideable, compute_s, schedule), critical


def exposed_share(hideable_s: float, window_s: float, schedule: str) -> float:
    """What of ``hideable_s`` seconds of asynchronous work stays exposed with ``window_s`` seconds
    of compute to hide under (serial schedule: all of it)."""
    return hideable_s if schedule == "serial" else max(0.0, hideable_s - max(0.0, window_s))


def _loss_phase_bytes(
    prog: Program, c_item: int, fsdp: int, tiled: bool, head_grad: int, grad_share: float
) -> float:
    # At the loss (deviceless XLA:GPU peaks): untiled, the float32 logits and their gradient in the
    # compute dtype, then that gradient and the head's float32 gradient [D, V] — the logits die when
    # their narrower gradient is made, before the head's gradient matmul, so the two pairs are never
    # live together (XLA's live ranges, llama3-8b fsdp=8 on GB200, bench/results/hide_grid.json's
    # trace; a float32 gradient keeps all three, as counted before the compute-dtype backward);
    # tiled, one tile's gradient, two float32 [D, V] (the head-gradient accumulator in and out; one
    # under FSDP in a narrower dtype: the other was the head in float32 for a float32 gradient)
    # and under FSDP the gathered head.  (TPU targets: _tpu_loss_phase_bytes.)
    inv = prog.inventory
    loss_bytes = head_grad + inv.logits_bytes * (1 + grad_share)
    if grad_share < 1:
        loss_bytes = max(
            inv.logits_bytes * (1 + grad_share), head_grad + inv.logits_bytes * grad_share
        )
    if tiled:
        narrow = fsdp > 1 and grad_share < 1
        loss_bytes = (
            (1 if narrow else 2) * head_grad
            + inv.logits_bytes * grad_share
            + (prog.head.params * c_item if fsdp > 1 else 0)
        )
    return loss_bytes


def _tpu_loss_phase_bytes(
    prog: Program, c_item: int, fsdp: int, tiled: bool, head_grad: int
) -> float:
    # At the loss on TPU, from XLA:TPU's buffer assignment and live ranges (Llama 3 8B, v5p, 4 and
    # 8 chips: bench/results/tpu_compile.json): the logits in the compute dtype, saved by the
    # forward (tierax.models.loss.logits_dtype); the head's float32 weight gradient [D, V] (XLA
    # fuses the logits' gradient into both backward matmuls and never writes it: the step's TPU
    # options keep the head gradient's reduction out of a windowed einsum, which would write it and
    # a transposed copy, tierax.launch.flags.TPU_FLAGS); under FSDP the head all-gathered in the
    # compute dtype for the backward's matmul; and either the final hidden states (float32) with
    # their gradient (compute dtype, [tokens, D] each: on 4 chips, the head gradient kept in float32
    # to the optimizer) or, under FSDP, the head gradient's all-reduce in the compute dtype (on 8
    # chips, the hidden states dead by then): the model counts the larger.  Tiled, XLA:TPU's live
    # set at the peak inside the loss scan's backward (Llama 3 8B, 8 v5p, fsdp=8, 1 × 8192, 4
    # tiles: bench/results/tpu_tiled_loss.json): one tile's logits (recomputed), the gathered head,
    # the tile's float32 head gradient [D, V] and its all-reduce in the compute dtype, and the
    # hidden states with their gradient — all of them together.  Without FSDP (not traced) the
    # compute-dtype [D, V] is the gradient's accumulator over the tiles.  What XLA:TPU assigns; a
    # libtpu older than 0.0.52 reports more temp than this at an untiled loss, which fixed_terms
    # adds (FixedTerms.reported_excess_bytes).
    logits = prog.inventory.logits_bytes * c_item / 4  # float32 (tierax.tracing.inventory)
    hidden = prog.tokens * prog.hidden * (4 + c_item)
    narrow_head = prog.head.params * c_item  # a [D, V] in the compute dtype
    gathered_head = narrow_head if fsdp > 1 else 0
    if tiled:
        return head_grad + narrow_head + logits + hidden + gathered_head
    # under FSDP the head gradient's all-reduce, the gathered head's size
    return logits + gathered_head + head_grad + max(hidden, gathered_head)


def _reported_excess(
    head: Head, c_item: int, fsdp: int, tiled: bool, tokens: int, version: str
) -> int:
    """libtpu_temp_excess_bytes where it applies: an untiled loss, a libtpu older than traced."""
    if tiled or not libtpu.older_than_traced(version):
        return 0
    return libtpu_temp_excess_bytes(head, c_item, fsdp, tokens)


# The most tokens per device at which libtpu 0.0.42.1's temp excess was measured
# (libtpu_temp_excess_bytes; the formula fails at 24,576).
LIBTPU_EXCESS_MAX_TOKENS = 8192


def libtpu_temp_excess_bytes(head: Head | None, c_item: int, fsdp: int, tokens: int) -> int:
    """What libtpu 0.0.42.1's ``temp_size_in_bytes`` holds beyond its own buffer assignment at an
    untiled loss's peak: one logits-sized buffer in the compute dtype ([tokens, V]) and three of the
    head's size in it ([V, D]), under FSDP (0 otherwise: not measured).

    Not a buffer of the step: 0.0.42.1's HLO buffer assignment holds the same buffers as 0.0.52's,
    its preallocated temp the size of 0.0.52's temp (bench/results/libtpu_trace_0.0.42.1.json
    beside libtpu_trace_0.0.52.json).  The excess is measured as 0.0.42.1's temp over 0.0.52's for
    the same plan (Llama 3 8B, 8 v5p, fsdp=8: 4.00 × V·D·2 bytes at 1 × 4096, 5.00 × at 2 × 4096
    and 1 × 8192; bench/results/tpu_default_env.json beside tpu_default_env_libtpu_0.0.52.json).
    With D = 4096 there, three head-sized buffers are also three 4096-token logits; 1 × 8192's
    excess (the same as 2 × 4096's) rules out three sequence-sized ones.

    Only up to the measured tokens per device (:data:`LIBTPU_EXCESS_MAX_TOKENS`): at 24,576 (the
    published TR-1 run's 3 × 8192 on 8 v6e, bench/results/libtpu_colors_tr1.json) the formula gives
    9.46e9 bytes where 0.0.42.1's temp exceeds its HBM heap by 1.66e9, so the cause is not this
    formula's; above it the term is 0 (nothing known, nothing added).
    """
    if fsdp <= 1 or head is None or tokens > LIBTPU_EXCESS_MAX_TOKENS:
        return 0
    return int(head.vocab * c_item * (tokens + 3 * head.hidden))


def _tpu_stack_copy_bytes(prog: Program, c_item: int, fsdp: int, ep: int) -> int:
    # XLA:TPU converts every stacked layer weight's shard to the compute dtype once, before the
    # forward loop, and keeps the copies through the backward (convert(param) at its peak,
    # bench/results/tpu_compile.json); the GPU's transposed float32 copies (_stack_copy_bytes) are
    # not made.  A shard (tierax.sharding.rules): the routed experts E over expert and D over the
    # fsdp axis (whole where D does not divide), so E·D·F / (expert · fsdp axis) -- XLA:TPU's
    # compile holds f32[L, E/expert, D/fsdp, F] per device (tests/test_tpu_stack_copy.py); every
    # other layer weight over ``fsdp`` (= the fsdp axis × expert).
    n_fsdp = fsdp // max(ep, 1)
    n_efsdp = n_fsdp if n_fsdp > 1 and prog.hidden % n_fsdp == 0 else 1
    return int(
        c_item
        * sum(
            (
                (g.layer_param_count - g.expert_param_count_per_layer) / fsdp
                + g.expert_param_count_per_layer / (max(ep, 1) * n_efsdp)
            )
            * g.num_layers
            for g in prog.inventory.groups
        )
    )


@takes_program(0)
def fixed_terms(prog: Program, rates: Rates, schedule: str) -> FixedTerms:
    rates = for_program(rates, prog)  # the fused attention kernel at the program's shape
    inv = prog.inventory
    c_item = jnp.dtype(prog.dtype).itemsize
    tokens = prog.tokens
    head = prog.head
    tiled = head is not None and head.tiled  # the backward recomputes each tile's logits
    executed, hbm_s, compute_s, fused_s = _compute(prog, rates, tiled)
    # Weights: FSDP-sharded over fsdp × expert (experts: E over expert, the rest over fsdp), split
    # over tensor where tensor-parallel (the inventory traces a layer per tensor shard already).
    fsdp = inv.mesh.get("fsdp", 1) * inv.mesh.get("expert", 1)
    ep = inv.mesh.get("expert", 1)
    p_item = jnp.dtype(prog.param_dtype).itemsize
    head_grad = head.params * p_item if head else 0  # the LM head's gradient, unsharded [D, V]
    tpu = rates.target in hardware.TPU_TARGETS
    # the logits' gradient ÷ float32 logits (TPU: _tpu_loss_phase_bytes)
    grad_share = 0.0 if tpu else c_item / 4
    per_group = _group_workspace(prog, c_item, fsdp, ep, tpu)
    workspace = _workspace(prog, per_group, fsdp, tiled, head_grad, grad_share)
    if tpu:
        # less the copies the program does not hold (Program.uncopied_stack_bytes)
        stack_copy = _tpu_stack_copy_bytes(prog, c_item, fsdp, ep) - prog.uncopied_stack_bytes
    else:
        stack_copy = _stack_copy_bytes(prog, p_item)
    coll, exposed_coll, critical_coll = _collectives(prog, rates, schedule, compute_s)
    excess = 0
    if prog.loss_bytes is not None:  # the front end's reading of its program's loss
        loss_bytes = prog.loss_bytes
    elif head is None:  # no head priced: the loss holds only the extra bytes
        loss_bytes = 0
    elif tpu:
        excess = _reported_excess(head, c_item, fsdp, tiled, tokens, rates.libtpu)
        loss_bytes = _tpu_loss_phase_bytes(prog, c_item, fsdp, tiled, head_grad) + excess
    else:
        loss_bytes = _loss_phase_bytes(prog, c_item, fsdp, tiled, head_grad, grad_share)
    # Bytes the trace does not see, live through the whole step: in both phases.
    workspace += prog.extra_bytes
    shared = workspace - max(per_group.values())  # cuDNN's, the head's gradient, extra bytes
    loss_bytes += prog.extra_bytes
    return FixedTerms(
        state_bytes=inv.param_bytes + inv.grad_bytes + inv.optimizer_bytes,
        workspace_bytes=int(workspace),
        logits_bytes=int(loss_bytes),
        compute_s=compute_s,
        collective_s=coll,
        exposed_collective_s=exposed_coll,
        critical_collective_s=critical_coll,
        model_flops=prog.model_flops,
        executed_flops=executed,
        # XLA:TPU writes the layers' gradients in the backward loop, after the loss (none among its
        # peak allocations there, bench/results/tpu_compile.json); XLA:GPU's loss-phase peaks held
        # them.
        embed_grad_bytes=inv.grad_bytes if tpu else int(inv.embed_param_count * p_item / fsdp),
        fixed_device_bytes=rates.fixed_device_bytes,
        stack_copy_bytes=int(stack_copy),
        hbm_s=hbm_s,
        fused_attention_s=fused_s,
        reported_excess_bytes=int(excess),
        after_backward_bytes=int(prog.after_backward_bytes),
        late_grad_bytes=int(prog.late_grad_bytes),
        group_workspace_bytes=tuple((n, int(b + shared)) for n, b in per_group.items()),
    )
