"""Activation inventory from abstract traces (``jax.make_jaxpr`` / ``jax.eval_shape``; nothing is
allocated).

For every layer group and activation name: bytes per layer per device, number of
layers, and the FLOPs its rematerialisation costs; per group the bytes a layer
saves with no remat at all, the recomputation every remat policy pays for unnamed
intermediates, and the layer's forward FLOPs; per device the parameter, gradient
and optimizer-state bytes.

Two entry points work on any JAX code, not only tierax's models:

* :func:`trace_inventory` — any function: every ``checkpoint_name``'d value with its
  bytes and execution count (scan trip counts multiplied in).
* :func:`layer_inventory` — any layer function ``f(x, params) -> y`` (the body of a
  scan over layers): adds recompute FLOPs, measured by tracing the layer under
  ``jax.checkpoint`` policies and counting matmul FLOPs:
  ``base = flops(save every named value) − flops(no remat)``, and for each name
  ``cost(n) = flops(save every named value but n) − flops(save every named value)``.
  The cost model adds these up (an additive approximation of what JAX recomputes).
  Each trace is the layer's linearization (forward + JVP), not its gradient: JAX's
  gradient of a ``checkpoint`` is the same partial evaluation followed by a transpose
  of the linear part, which has the same matmul FLOPs under every policy, so the
  differences above are the gradient's, at a third of the tracing time.
  The same traces give the non-matmul HBM bytes (:mod:`tierax.tracing.hbm`): each policy's tangent
  part holds its recomputation, so ``base`` and ``cost(n)`` in bytes are the same differences; the
  forward's and the backward's own bytes come from one ``jax.vjp`` trace of the layer (a custom
  VJP's backward — blockwise attention's — is only in that one).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from tierax import names as N
from tierax import plan as plan_lib
from tierax.models import moe
from tierax.models.attention import FUSED_SCOPE
from tierax.tracing import hbm, jaxpr_tools

# The fields that grow with the microbatch (activations ∝ batch; field metadata): an inventory is
# a pytree with these as its leaves and every other field as its structure, so extrapolating one
# to another microbatch is one jax.tree.map (tierax.solving.planner.max_microbatch).
PER_MICROBATCH = {"per_microbatch": True}


def per_microbatch_pytree(cls):
    """Register the dataclass ``cls`` as a pytree whose leaves are its :data:`PER_MICROBATCH`
    fields."""
    fields = [f.name for f in dataclasses.fields(cls)]
    data = [f.name for f in dataclasses.fields(cls) if f.metadata.get("per_microbatch")]
    meta = [n for n in fields if n not in data]
    return jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=meta)


@per_microbatch_pytree
@dataclass(frozen=True)
class Activation:
    """One named activation of one layer group (per device)."""

    group: str
    name: str
    bytes_per_layer: int = dataclasses.field(metadata=PER_MICROBATCH)
    num_layers: int
    recompute_flops_per_layer: float = dataclasses.field(default=0.0, metadata=PER_MICROBATCH)
    recompute_hbm_bytes_per_layer: float = (
        0.0  # non-matmul HBM traffic that recomputing it adds (tierax.tracing.hbm)
    )
    recompute_fused_flops_per_layer: float = (
        0.0  # of recompute_flops, those inside a fused attention kernel
    )
    # XLA:CPU's transposing fusions read (tierax.tracing.hbm.transposed_reads), by row-stride class
    transposed_elems_per_layer: float = 0.0
    transposed_aliased_elems_per_layer: float = 0.0
    # Whether the layer's backward needs the value at all: saving it under a ``jax.checkpoint``
    # policy adds it to the layer's residuals.  False for a value only the layer's output is made
    # from (Llama's ``mlpwo``, which feeds only the residual add): JAX's partial evaluation drops it
    # from the residuals whatever the policy says, so keeping or offloading it holds and moves
    # nothing (:attr:`held_bytes_per_layer` 0) — MaxText's ``mlpwo: offload`` included.
    residual: bool = True
    # Whether the value is itself one of the layer's written residuals
    # (tierax.tracing.hbm.written_residuals: a boundary's output, not an elementwise function of
    # others): kept on device, XLA:TPU's backward of a layer reads it from its saved stack rather
    # than holding it again in the layer's workspace (tierax.costmodel.kept_reads).
    read_in_place: bool = False
    # The value's logical bytes per layer (its traced shape's) where its layer stack takes more
    # (``bytes_per_layer``: a TPU's tiled layout, tierax.hardware.tpu_tiling); 0: the same bytes.
    logical_bytes_per_layer: int = dataclasses.field(default=0, metadata=PER_MICROBATCH)
    # The bytes per layer its stack takes on the host where XLA lays the offloaded stack out
    # otherwise than the device's (tierax.hardware.tpu_tiling.host_stacked_value_bytes); 0: the
    # same bytes as on device.
    host_bytes_per_layer: int = dataclasses.field(default=0, metadata=PER_MICROBATCH)
    # The host bytes of the largest one of the layer's values of this name, where the layer tags
    # the name more than once (a scanned block of several layers tags it once in each): what one
    # value takes in a host buffer of its own rather than a slot of its stack; 0: the layer's one
    # value (:attr:`host_stack_bytes_per_layer`).
    host_value_bytes_per_layer: int = dataclasses.field(default=0, metadata=PER_MICROBATCH)
    # The layer's forward matmul FLOPs run before the value is first made (of them, those in a
    # fused attention kernel), and before the work that writes it begins: where in its layer a
    # store of it can start or must end (tierax.costmodel.terms.store_window_s).
    flops_made_per_layer: float = dataclasses.field(default=0.0, metadata=PER_MICROBATCH)
    fused_flops_made_per_layer: float = dataclasses.field(default=0.0, metadata=PER_MICROBATCH)
    flops_before_per_layer: float = dataclasses.field(default=0.0, metadata=PER_MICROBATCH)
    fused_flops_before_per_layer: float = dataclasses.field(default=0.0, metadata=PER_MICROBATCH)

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_layer * self.num_layers

    @property
    def held_bytes_per_layer(self) -> int:
        """Bytes per layer the step holds (on device or host) when the plan saves this value."""
        return self.bytes_per_layer if self.residual else 0

    @property
    def held_total_bytes(self) -> int:
        return self.held_bytes_per_layer * self.num_layers

    @property
    def host_stack_bytes_per_layer(self) -> int:
        """:attr:`bytes_per_layer` as its stack is laid out on the host when offloaded."""
        return self.host_bytes_per_layer or self.bytes_per_layer

    @property
    def host_held_bytes_per_layer(self) -> int:
        """:attr:`held_bytes_per_layer` as its stack is laid out on the host when offloaded."""
        return self.host_stack_bytes_per_layer if self.residual else 0

    @property
    def host_value_held_bytes(self) -> int:
        """The host bytes of the layer's largest value of this name (:attr:`host_value_bytes_per_
        layer`) where the backward needs it, 0 where it does not."""
        if not self.residual:
            return 0
        return self.host_value_bytes_per_layer or self.host_stack_bytes_per_layer

    @property
    def logical_held_bytes_per_layer(self) -> int:
        """:attr:`held_bytes_per_layer` at the value's logical bytes: what a layer's workspace,
        traced at logical shapes, counts of it."""
        if not self.residual:
            return 0
        return self.logical_bytes_per_layer or self.bytes_per_layer


@per_microbatch_pytree
@dataclass(frozen=True)
class GroupInventory:
    name: str
    num_layers: int
    activations: tuple[Activation, ...] = dataclasses.field(metadata=PER_MICROBATCH)
    # the scan carry (layer input), saved per layer under any plan
    carry_bytes_per_layer: int = dataclasses.field(metadata=PER_MICROBATCH)
    # activation residuals of one layer with no remat (named + unnamed)
    save_all_bytes_per_layer: int = dataclasses.field(metadata=PER_MICROBATCH)
    # recomputed under any remat policy (unnamed intermediates)
    base_recompute_flops_per_layer: float = dataclasses.field(metadata=PER_MICROBATCH)
    # matmul FLOPs of one layer's forward
    forward_flops_per_layer: float = dataclasses.field(metadata=PER_MICROBATCH)
    layer_param_count: (
        int  # per tensor shard (the layer traced with heads/hidden divided by tensor)
    )
    expert_param_count_per_layer: int = 0  # per tensor shard
    # Bytes one layer's forward moves through collectives (per device): the expert-parallel
    # dispatch + combine all-to-alls and the tensor-parallel all-reduces.  The backward moves as
    # much again; a rematerialised layer repeats its forward's.
    forward_collective_bytes_per_layer: float = 0.0
    # The same bytes by the mesh axis they cross: (("tensor", TP all-reduce bytes), ("expert", EP
    # all-to-all bytes)).
    forward_collective_bytes_by_axis: tuple = ()
    # Non-matmul HBM traffic of one layer (tierax.tracing.hbm's fusion model): its forward, its
    # backward without recomputation, and what every remat policy of the group recomputes (unnamed
    # intermediates).
    forward_hbm_bytes_per_layer: float = 0.0
    backward_hbm_bytes_per_layer: float = 0.0
    base_recompute_hbm_bytes_per_layer: float = 0.0
    # The forward's and the backward's gathers and scatters as (indices, scattered bytes)
    # (tierax.tracing.hbm.phase_indexed), which XLA:TPU runs below HBM bandwidth.  Not counted
    # in a recomputation: XLA:TPU runs a MoE layer's as often under remat-full as under minimal
    # (bench/results/chip/profiles: moe_remat_full_ops.json, moe_minimal_ops.json).
    forward_indexed_per_layer: tuple = (0.0, 0.0)
    backward_indexed_per_layer: tuple = (0.0, 0.0)
    # Elements XLA:CPU's slow transposing fusions read per layer
    # (tierax.tracing.hbm.transposed_reads):
    # rows a multiple of 4 KiB apart (aliased) and the others (spread).
    transposed_always_elems_per_layer: float = 0.0
    transposed_residual_elems_per_layer: float = 0.0
    transposed_carry_elems_per_layer: float = 0.0
    transposed_always_aliased_elems_per_layer: float = 0.0
    transposed_residual_aliased_elems_per_layer: float = 0.0
    transposed_carry_aliased_elems_per_layer: float = 0.0
    # Of the forward's and the base recomputation's matmul FLOPs, those inside a fused attention
    # kernel (attention=cudnn: its host stand-in's scope), which the cost model prices at the
    # kernel's rates.
    fused_attention_flops_per_layer: float = 0.0
    base_recompute_fused_flops_per_layer: float = 0.0
    # Of the forward's matmul FLOPs, the share in fp8 GEMMs (quantization: fp8; their backward
    # GEMMs are fp8 too); the cost model prices that share of every matmul term of the group
    # (forward, backward, recomputation) at the target's fp8 rate.
    fp8_flops_share: float = 0.0
    # The forward's GEMM FLOPs by each matmul's smallest dimension (its M, K or N:
    # jaxpr_tools.gemm_min_dim), as ((dimension, share of the GEMM FLOPs), ...) ascending, a fused
    # attention kernel's matmuls left out (they run at the kernel's rate); a matmul's backward
    # GEMMs share its dimensions.  Where the target's GEMM rate depends on it
    # (XLA:CPU: Rates.matmul_size_rates) each share of every matmul term of the group is priced at
    # its dimension's rate; a recomputation at the group's blend.
    matmul_min_dim_shares: tuple = ()
    # Of the non-matmul HBM figures above (and each activation's recompute bytes, by name), the
    # bytes of the weights' own work (their casts, their gradients' casts) as traced: whole
    # weights.  On a mesh that splits the weights, a device moves its shard's share
    # (:func:`shard_weight_work`; :mod:`tierax.tracing.hbm`).
    weight_hbm_bytes: tuple = ()
    # What XLA:TPU holds of save_all_bytes_per_layer when the layer is recomputed in its backward
    # (tierax.tracing.hbm.written_residual_bytes): the residuals less the elementwise-made ones,
    # which it fuses into their consumers, plus the values those fusions read.
    written_residual_bytes_per_layer: int = dataclasses.field(default=0, metadata=PER_MICROBATCH)


@per_microbatch_pytree
@dataclass(frozen=True)
class Inventory:
    """Everything the cost model needs about one model at one shape on one mesh (per device)."""

    model: str
    microbatch: int = dataclasses.field(metadata=PER_MICROBATCH)  # sequences per device
    seq: int
    mesh: dict
    groups: tuple[GroupInventory, ...] = dataclasses.field(metadata=PER_MICROBATCH)
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    logits_bytes: int = dataclasses.field(metadata=PER_MICROBATCH)
    embed_param_count: int
    loss_hbm_bytes: float = (
        0.0  # non-matmul HBM traffic of the loss, forward and backward (tierax.tracing.hbm)
    )
    # Parameters per device of each layer group, ((group, count), ...), as the step shards them
    # (what a group's training state is counted from); empty for an inventory of the Python API
    # (group_param_count then falls back to the traced layer's parameters over fsdp × expert).
    group_param_counts: tuple = ()
    # AdamW's moment bytes per parameter (moment_bytes_per_param); 0: two in the parameter dtype.
    moment_bytes_per_param: int = 0

    @property
    def devices(self) -> int:
        return math.prod(self.mesh.values())

    def activations(self) -> list[Activation]:
        return [a for g in self.groups for a in g.activations]

    def group(self, name: str) -> GroupInventory:
        return next(g for g in self.groups if g.name == name)

    def group_param_count(self, group: str) -> float:
        """Parameters per device of layer group ``group`` (a segment ``group@A-B``: its share)."""
        base, _, _ = group.partition("@")
        g = self.group(group)
        whole = sum(x.num_layers for x in self.groups if x.name.partition("@")[0] == base)
        counts = dict(self.group_param_counts)
        if base in counts:
            return counts[base] * g.num_layers / whole
        ways = self.mesh.get("fsdp", 1) * self.mesh.get("expert", 1)
        return g.layer_param_count * g.num_layers / ways


def trace_inventory(fn: Callable, *args) -> list[Activation]:
    """Named values of ``fn(*args)`` (args may be ShapeDtypeStructs), summed per (group, name).

    The group is the ``tierax_group_<name>`` scope around a scan, else ``<top>``.
    """
    jaxpr = jax.make_jaxpr(fn)(*args)
    per_layer: dict[tuple[str, str], int] = defaultdict(int)
    layers: dict[tuple[str, str], int] = {}
    for v in jaxpr_tools.named_values(jaxpr):
        key = (v.group, v.name)
        per_layer[key] += v.nbytes
        layers[key] = v.count
    return [Activation(g, n, per_layer[(g, n)], layers[(g, n)]) for (g, n) in per_layer]


def _nbytes(x) -> int:
    return math.prod(x.shape) * jnp.dtype(x.dtype).itemsize


def _residual_bytes(layer_fn, x, params, policy, param_shapes) -> int:
    """Bytes of the residuals ``jax.checkpoint(layer_fn, policy)``'s backward keeps (``jax.vjp``'s
    closure), the parameters and their compute-dtype casts left out (weights, accounted for with
    the parameters)."""
    f = jax.checkpoint(layer_fn, policy=policy, prevent_cse=False)
    residuals = jax.eval_shape(lambda a, p: jax.vjp(f, a, p)[1], x, params)
    return sum(_nbytes(r) for r in jax.tree.leaves(residuals) if tuple(r.shape) not in param_shapes)


def _remat_flops(layer_fn, x, params, policy, weightless=None) -> tuple[float, float, float, float]:
    """Matmul FLOPs of the forward plus the linearized (JVP) layer under ``policy`` (None: no
    checkpoint), the non-matmul HBM bytes of its tangent part (the recomputation is in it:
    :mod:`tierax.tracing.hbm`), the FLOPs of the first figure that run inside a fused attention
    kernel, and the HBM bytes without the weights' own work.

    Only differences between policies are used: they equal the gradient's (the recomputation that
    the policy's partial evaluation puts in the backward; transposing the linear part changes no
    matmul count), and the transpose is the costliest part of tracing a gradient.
    """
    f = layer_fn if policy is None else jax.checkpoint(layer_fn, policy=policy, prevent_cse=False)

    def linearized(x, p, tx, tp):
        return jax.linearize(f, x, p)[1](*hbm.marker((tx, tp)))

    jaxpr = jax.make_jaxpr(linearized)(x, params, x, params)
    return (
        float(jaxpr_tools.matmul_flops(jaxpr)),
        hbm.phase_bytes(jaxpr)[1],
        float(jaxpr_tools.matmul_flops(jaxpr, scope=FUSED_SCOPE)),
        hbm.phase_bytes(jaxpr, weightless)[1],
    )


def layer_inventory(
    layer_fn: Callable,
    x: jax.ShapeDtypeStruct,
    params,
    *,
    group: str,
    num_layers: int,
    expert_param_count: int = 0,
    stacked_bytes: Callable[[tuple, str], int] | None = None,
    host_stacked_bytes: Callable[[str, tuple, str], int] | None = None,
) -> GroupInventory:
    """Inventory of one layer function ``layer_fn(x, params) -> y`` of a scanned group.

    Args:
      layer_fn: the layer body (what a ``lax.scan`` over layers calls), tagging its
        activations with ``checkpoint_name``.
      x: the layer input (per device), a ShapeDtypeStruct.
      params: one layer's parameters (pytree of ShapeDtypeStructs).
      group: the layer group name; num_layers: the scan length.
      stacked_bytes: ``(shape, dtype) -> bytes`` a saved value of that shape takes in its layer
        stack (None: its logical bytes); a TPU's tiled layout
        (:func:`tierax.hardware.tpu_tiling.stacked_value_bytes`).  Each name's bytes are its
        values' stacked bytes, and the residuals with no remat grow by the named residuals' excess.
      host_stacked_bytes: ``(name, shape, dtype) -> bytes`` the value's stack takes on the host
        when offloaded, where XLA lays it out otherwise (None: as on device;
        :func:`tierax.hardware.tpu_tiling.host_stacked_value_bytes`).

    The non-matmul HBM figures are the traced layer's, whole weights; ``weight_hbm_bytes`` says
    how much of each is the weights' own work (:func:`shard_weight_work` scales it to a mesh).
    """
    fwd = jax.make_jaxpr(layer_fn)(x, params)
    per_name: dict[str, int] = defaultdict(int)
    logical: dict[str, int] = defaultdict(int)
    on_host: dict[str, int] = defaultdict(int)
    largest: dict[str, int] = defaultdict(int)  # the largest one value's host bytes
    values: dict[str, int] = defaultdict(int)
    before = jaxpr_tools.flops_before_names(fwd, scope=FUSED_SCOPE)
    for v in jaxpr_tools.named_values(fwd):
        stacked = v.nbytes if stacked_bytes is None else stacked_bytes(v.shape, v.dtype)
        per_name[v.name] += stacked * v.count
        logical[v.name] += v.nbytes * v.count
        host = (
            stacked if host_stacked_bytes is None else host_stacked_bytes(v.name, v.shape, v.dtype)
        )
        on_host[v.name] += host * v.count
        largest[v.name] = max(largest[v.name], host * v.count)
        values[v.name] += 1
    names = list(per_name)

    # Residuals of the layer with no remat: the leaves of its VJP closure, minus the parameters and
    # their compute-dtype casts (weights, not activations: accounted for with the parameters).
    param_shapes = {tuple(p.shape) for p in jax.tree.leaves(params)}
    save_all, written, written_names = hbm.written_residuals(layer_fn, x, params)

    save_named = jax.checkpoint_policies.save_only_these_names(*names)
    # A name is a residual where leaving it out of the saved names shrinks the residuals (a
    # name-only policy saves nothing else in its place: what is not saved is recomputed from the
    # layer input).
    named_residuals = _residual_bytes(layer_fn, x, params, save_named, param_shapes)
    residual = {N.DECODER_LAYER_INPUT: True}
    for n in names:
        if n not in residual:
            others = jax.checkpoint_policies.save_only_these_names(*[m for m in names if m != n])
            residual[n] = named_residuals > _residual_bytes(
                layer_fn, x, params, others, param_shapes
            )
    # Each HBM figure also without the weights' own work (their shapes moving no bytes), so that
    # the difference, the weights' share, can be scaled to a mesh's shards after tracing.
    weightless = {tuple(p.shape): math.inf for p in jax.tree.leaves(params)}
    (
        (flops_none, hbm_none, fused_none, hbm0_none),
        (flops_named, hbm_named, fused_named, hbm0_named),
    ) = (_remat_flops(layer_fn, x, params, p, weightless) for p in (None, save_named))
    costs, weight_share = {}, {}
    for n in names:
        if n == N.DECODER_LAYER_INPUT:
            costs[n] = (0.0, 0.0, 0.0)  # the scan carry: its value is at hand whatever the plan
            continue
        others = jax.checkpoint_policies.save_only_these_names(*[m for m in names if m != n])
        flops, hbm_bytes, fused, hbm0 = _remat_flops(layer_fn, x, params, others, weightless)
        costs[n] = (
            max(0.0, flops - flops_named),
            max(0.0, hbm_bytes - hbm_named),
            max(0.0, fused - fused_named),
        )
        weight_share[n] = min(costs[n][1], max(0.0, (hbm_bytes - hbm0) - (hbm_named - hbm0_named)))
    (fwd_hbm, bwd_hbm), (fwd0, bwd0), transposed, (fwd_idx, bwd_idx) = hbm.layer_traffic(
        layer_fn, x, params, weightless
    )
    base = max(0.0, hbm_named - hbm_none)
    weight_share |= {
        "@forward": fwd_hbm - fwd0,
        "@backward": bwd_hbm - bwd0,
        "@base_recompute": min(base, max(0.0, (hbm_named - hbm0_named) - (hbm_none - hbm0_none))),
    }
    spread, aliased = transposed["spread"], transposed["aliased"]
    acts = tuple(
        Activation(
            group,
            n,
            per_name[n],
            num_layers,
            *costs[n],
            transposed_elems_per_layer=spread["named"].get(n, 0.0),
            transposed_aliased_elems_per_layer=aliased["named"].get(n, 0.0),
            residual=residual[n],
            read_in_place=n in written_names,
            logical_bytes_per_layer=logical[n] if logical[n] != per_name[n] else 0,
            host_bytes_per_layer=on_host[n] if on_host[n] != per_name[n] else 0,
            host_value_bytes_per_layer=largest[n] if values[n] > 1 else 0,
            flops_made_per_layer=before[n][0],
            fused_flops_made_per_layer=before[n][1],
            flops_before_per_layer=before[n][2],
            fused_flops_before_per_layer=before[n][3],
        )
        for n in names
    )
    return GroupInventory(
        name=group,
        num_layers=num_layers,
        activations=acts,
        carry_bytes_per_layer=_nbytes(x),
        save_all_bytes_per_layer=int(save_all)
        + sum(per_name[n] - logical[n] for n in names if residual[n]),
        base_recompute_flops_per_layer=max(0.0, flops_named - flops_none),
        forward_flops_per_layer=float(jaxpr_tools.matmul_flops(fwd)),
        layer_param_count=sum(math.prod(p.shape) for p in jax.tree.leaves(params)),
        expert_param_count_per_layer=expert_param_count,
        forward_hbm_bytes_per_layer=fwd_hbm,
        backward_hbm_bytes_per_layer=bwd_hbm,
        base_recompute_hbm_bytes_per_layer=max(0.0, hbm_named - hbm_none),
        forward_indexed_per_layer=fwd_idx,
        backward_indexed_per_layer=bwd_idx,
        transposed_always_elems_per_layer=spread["always"],
        transposed_residual_elems_per_layer=spread["residual"],
        transposed_carry_elems_per_layer=spread["carry"],
        transposed_always_aliased_elems_per_layer=aliased["always"],
        transposed_residual_aliased_elems_per_layer=aliased["residual"],
        transposed_carry_aliased_elems_per_layer=aliased["carry"],
        fused_attention_flops_per_layer=float(jaxpr_tools.matmul_flops(fwd, scope=FUSED_SCOPE)),
        base_recompute_fused_flops_per_layer=max(0.0, fused_named - fused_none),
        fp8_flops_share=(
            jaxpr_tools.fp8_matmul_flops(fwd) / max(1.0, jaxpr_tools.matmul_flops(fwd))
        ),
        matmul_min_dim_shares=_shares(
            jaxpr_tools.matmul_flops_by_min_dim(fwd, exclude_scope=FUSED_SCOPE)
        ),
        weight_hbm_bytes=tuple(sorted(weight_share.items())),
        written_residual_bytes_per_layer=int(written),
    )


def _shares(flops_by_dim: dict[int, int]) -> tuple:
    total = sum(flops_by_dim.values())
    return tuple((d, f / total) for d, f in sorted(flops_by_dim.items()) if f) if total else ()


def _has_experts(cfg, group: str) -> bool:
    """Whether ``group``'s layers are MoE layers (DeepSeek's ``moe`` group, an MoE Llama's one)."""
    if cfg.family == "deepseek":
        return group == "moe"
    return cfg.family == "llama" and bool(cfg.num_experts)


def _expert_params_per_layer(cfg, group: str) -> int:
    return cfg.num_experts * cfg.expert_params() if _has_experts(cfg, group) else 0


def tensor_shard_config(cfg, tensor: int):
    """``cfg`` as one tensor-parallel shard sees it: heads, kv heads and MLP/expert hidden sizes ÷
    ``tensor``.

    Tracing a layer of this config at the per-device batch gives per-device activation
    shapes (column-parallel outputs split over ``tensor``, row-parallel outputs whole).
    """
    import dataclasses

    if tensor == 1:
        return cfg
    if cfg.family == "llama":
        return dataclasses.replace(
            cfg,
            num_heads=cfg.num_heads // tensor,
            num_kv_heads=cfg.num_kv_heads // tensor,
            mlp_dim=cfg.mlp_dim // tensor,
        )
    return dataclasses.replace(
        cfg,
        num_heads=cfg.num_heads // tensor,
        dense_mlp_dim=cfg.dense_mlp_dim // tensor,
        expert_mlp_dim=cfg.expert_mlp_dim // tensor,
    )


def weight_ways(path, shape: tuple, mesh: dict) -> int:
    """The ways :mod:`tierax.sharding.rules` splits one stacked weight (``path``, ``shape``) over
    the mesh's axes other than ``tensor`` (the layer is traced at tensor-sharded shapes already)."""
    from tierax.sharding.rules import param_spec

    rest = {a: n for a, n in mesh.items() if a != "tensor"}
    ways = 1
    for entry in param_spec(path, tuple(shape), rest):
        for axis in (entry,) if isinstance(entry, str) else (entry or ()):
            ways *= rest.get(axis, 1)
    return ways


def shard_weight_work(gi: GroupInventory, ways: int) -> GroupInventory:
    """``gi`` with the weights' own non-matmul work (``weight_hbm_bytes``) at one ``ways``-th:
    XLA casts a float32 shard before gathering it, casts a gradient after reduce-scattering it, and
    an expert-parallel device casts only its own experts (:mod:`tierax.tracing.hbm`)."""
    if ways <= 1 or not gi.weight_hbm_bytes:
        return gi
    keep = 1 - 1 / ways
    share = dict(gi.weight_hbm_bytes)
    acts = tuple(
        dataclasses.replace(
            a,
            recompute_hbm_bytes_per_layer=a.recompute_hbm_bytes_per_layer
            - keep * share.get(a.name, 0.0),
        )
        for a in gi.activations
    )
    return dataclasses.replace(
        gi,
        activations=acts,
        forward_hbm_bytes_per_layer=gi.forward_hbm_bytes_per_layer - keep * share["@forward"],
        backward_hbm_bytes_per_layer=gi.backward_hbm_bytes_per_layer - keep * share["@backward"],
        base_recompute_hbm_bytes_per_layer=gi.base_recompute_hbm_bytes_per_layer
        - keep * share["@base_recompute"],
    )


RING_NAMES = (N.MOE_MLPWI_0, N.MOE_MLPWI_1, N.MOE_MLPWO)


def widen_ring_rows(gi: GroupInventory, factor: float) -> GroupInventory:
    """``gi`` with the grouped GEMMs' outputs (:data:`RING_NAMES`) ``factor`` times the rows the
    layer was traced with: ``moe_impl=ragged`` under expert parallelism runs them on the ring's
    buffer (:func:`tierax.models.moe.ring_rows_factor`), the trace on one device's own
    assignments.  What the residuals of the layer hold grows by as much; the FLOPs do not (each
    device computes its experts' share of the group's assignments: as many as its own tokens'
    under balanced routing)."""
    if factor == 1.0:
        return gi
    acts, grown = [], 0
    for a in gi.activations:
        if a.name in RING_NAMES:
            wide = int(round(a.bytes_per_layer * factor))
            grown += (wide - a.bytes_per_layer) if a.residual else 0
            a = dataclasses.replace(a, bytes_per_layer=wide)
        acts.append(a)
    return dataclasses.replace(
        gi,
        activations=tuple(acts),
        save_all_bytes_per_layer=gi.save_all_bytes_per_layer + grown,
        written_residual_bytes_per_layer=gi.written_residual_bytes_per_layer + grown,
    )


def per_device_param_count(cfg, mesh: dict) -> float:
    """Parameters per device under :mod:`tierax.sharding.rules`'s rules (what the step really
    holds)."""
    return sum(per_device_group_param_counts(cfg, mesh).values())


def per_device_group_param_counts(cfg, mesh: dict) -> dict:
    """:func:`per_device_param_count` by layer group (key None: the embedding, final norm and
    head, outside every group)."""
    from tierax.plan.state import layer_group_of
    from tierax.sharding.rules import param_spec

    out: dict = {}
    for path, shape in _param_shapes(cfg):
        spec = param_spec(path, shape, mesh)
        ways = 1
        for entry in spec:
            for axis in (entry,) if isinstance(entry, str) else (entry or ()):
                ways *= mesh.get(axis, 1)
        group = layer_group_of(path)
        out[group] = out.get(group, 0.0) + math.prod(shape) / ways
    return out


def moment_bytes_per_param(cfg) -> int:
    """Bytes of AdamW's two moments per parameter: the first (mu) in ``cfg.mu_dtype`` where the
    config has one (MaxText's key; unset or empty: the parameter dtype), the second (nu) in the
    parameter dtype (optax.adamw's ``mu_dtype`` casts mu only).  The one place moment bytes are
    counted."""
    p_item = jnp.dtype(cfg.param_dtype).itemsize
    mu = getattr(cfg, "mu_dtype", None)
    return (jnp.dtype(mu).itemsize if mu else p_item) + p_item


_SHAPES: dict = {}  # cfg → its parameters' (path, shape), the last few configs


def _param_shapes(cfg) -> tuple:
    """Every parameter's (tree path, shape) of ``cfg``'s model, from an abstract build (kept per
    config: a mesh search asks for the same model's shapes on every candidate mesh)."""
    from tierax.models import abstract_model

    def build():
        _, abstract = nnx.split(abstract_model(cfg))
        return tuple(
            (path, tuple(leaf.shape))
            for path, leaf in jax.tree_util.tree_leaves_with_path(abstract)
        )

    if cfg not in _SHAPES:  # a config is its own key (a frozen dataclass of scalars)
        if len(_SHAPES) >= 8:
            del _SHAPES[next(iter(_SHAPES))]
        _SHAPES[cfg] = build()
    return _SHAPES[cfg]


def _forward_collective_bytes(cfg, group: str, microbatch: int, seq: int, mesh: dict) -> tuple:
    """Per-device bytes one layer's forward sends through collectives, by mesh axis (ring
    all-reduce: 2(t−1)/t)."""
    item = jnp.dtype(cfg.dtype).itemsize
    tokens = microbatch * seq
    out = []
    t, ep = mesh.get("tensor", 1), mesh.get("expert", 1)
    if t > 1:  # attention-out and MLP-down all-reduces over tensor
        out.append(("tensor", 2 * 2 * (t - 1) / t * tokens * cfg.d_model * item))
    if ep > 1 and _has_experts(cfg, group) and getattr(cfg, "moe_impl", "") == "ragged":
        out.append(("expert", moe.ragged_collective_bytes(cfg, tokens, ep)))
    elif ep > 1 and _has_experts(cfg, group):  # dispatch + combine over expert, capacity-padded
        buffer = cfg.num_experts * cfg.capacity(tokens) * cfg.d_model * item
        out.append(("expert", 2 * buffer * (ep - 1) / ep))
    return tuple(out)


def _memoised(fn):
    """``fn(cfg, microbatch, seq, mesh)`` cached within the process (the last 32 argument sets).

    The traces are deterministic in these arguments, so a repeated call (``--max-microbatch``,
    ``--for``, sweeps, what-ifs) reuses them; each caller gets its own ``mesh`` dict.  A model
    config is a frozen dataclass of scalars, so it is its own key.
    """

    @functools.lru_cache(maxsize=32)
    def cached(cfg, microbatch, seq, mesh_items):
        return fn(cfg, microbatch, seq, dict(mesh_items))

    @functools.wraps(fn)
    def wrapper(cfg, microbatch, seq, mesh=None):
        inv = cached(cfg, microbatch, seq, tuple((mesh or {}).items()))
        return dataclasses.replace(inv, mesh=dict(inv.mesh))

    wrapper.cache_clear = cached.cache_clear
    return wrapper


_TRACES: dict = {}  # (cfg, microbatch, seq, tensor) → _traced_groups, the last _TRACES_KEPT
_TRACES_KEPT = 512  # a 128-device search has up to ~100 local shapes; each entry is small


def _traced_groups(cfg, microbatch: int, seq: int, tensor: int) -> tuple:
    """Each layer group's trace at the local shape (``microbatch`` sequences per device, heads and
    MLP widths divided by ``tensor``), with its largest weight's (path, shape): all the inventory
    takes from the mesh besides the weights' split, which is applied after
    (:func:`shard_weight_work`), so meshes that differ elsewhere (``tierax plan --mesh auto``'s
    candidates) share one trace.  Kept within the process (a config is its own key: a frozen
    dataclass of scalars)."""
    key = (cfg, microbatch, seq, tensor)
    if key in _TRACES:
        return _TRACES[key]
    if len(_TRACES) >= _TRACES_KEPT:
        del _TRACES[next(iter(_TRACES))]
    _TRACES[key] = _trace_groups(cfg, microbatch, seq, tensor)
    return _TRACES[key]


def _stacked_bytes(cfg):
    """How a saved value of ``cfg``'s layers is sized in its stack: under splash attention (the
    TPU kernel) XLA:TPU lays each [batch, seq, heads, head_dim] value out head_dim-minor, the
    layout the kernel reads, in 128-lane tiles on device and host alike
    (:func:`tierax.hardware.tpu_tiling.stacked_value_bytes`: a head dim of 64 takes twice its
    logical bytes); otherwise its logical bytes (None)."""
    from tierax.hardware import tpu_tiling

    return tpu_tiling.stacked_value_bytes if cfg.attention == "splash" else None


def _host_stacked_bytes(cfg, microbatch: int):
    """How an offloaded value of ``cfg``'s layers is sized in its host stack: under splash
    attention XLA:TPU lays some out otherwise than on device
    (:func:`tierax.hardware.tpu_tiling.host_stacked_value_bytes`); otherwise as on device (None)."""
    if cfg.attention != "splash":
        return None
    from tierax.hardware import tpu_tiling

    _, dqk, dv = cfg.attention_dims()
    return functools.partial(
        tpu_tiling.host_stacked_value_bytes, microbatch=microbatch, value_padded=dv != dqk
    )


def _trace_groups(cfg, microbatch: int, seq: int, tensor: int) -> tuple:
    from tierax.models import abstract_model
    from tierax.models.config import host_traceable, require_concrete_attention

    require_concrete_attention(cfg, "the inventory")
    local = host_traceable(tensor_shard_config(cfg, tensor))
    if cfg.attention == "cudnn_blockwise":
        local = _as_compiled(local)
    model = abstract_model(local)
    dtype = jnp.dtype(cfg.dtype)
    x = jax.ShapeDtypeStruct((microbatch, seq, cfg.d_model), dtype)
    groups = []
    for g in local.layer_groups():
        graphdef, stacked = nnx.split(model.groups[g.name])
        one = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), stacked)

        def layer_fn(a, p, graphdef=graphdef):
            return nnx.merge(graphdef, p)(a)

        gi = layer_inventory(
            layer_fn,
            x,
            one,
            group=g.name,
            num_layers=g.num_layers,
            expert_param_count=_expert_params_per_layer(local, g.name),
            stacked_bytes=_stacked_bytes(cfg),
            host_stacked_bytes=_host_stacked_bytes(cfg, microbatch),
        )
        # The split of the group's largest weight stands for its weights' (every weight of the
        # reference models is split alike where its dimensions divide).
        largest = max(
            jax.tree_util.tree_leaves_with_path(stacked), key=lambda kv: math.prod(kv[1].shape)
        )
        if cfg.attention == "cudnn_blockwise" and local.attention == "cudnn_blockwise":
            gi = _unfused(gi)
        groups.append((gi, (largest[0], tuple(largest[1].shape))))
    return tuple(groups)


def _as_compiled(local):
    """``attention=cudnn_blockwise`` chosen by the user (not the host stand-in of ``cudnn``)
    compiles to plain XLA code, no cuDNN call (tests/test_cost_attention_kinds.py counts them in a
    deviceless GPU compile): it is priced as that code, not as the fused kernel whose stand-in it
    is.  Where the value head dim equals the query/key one it is exactly blockwise attention in
    128-key blocks (``padded_value_attention`` pads nothing), traced as such: its matmuls at the
    matmul rate, its score blocks' HBM traffic counted.  Otherwise (MLA) see :func:`_unfused`."""
    from tierax.models.attention import FUSED_TILE

    _, dqk, dv = local.attention_dims()
    if dv != dqk:
        return local
    return dataclasses.replace(local, attention="blockwise", attention_block=FUSED_TILE)


def _unfused(gi: GroupInventory) -> GroupInventory:
    """A user's ``attention=cudnn_blockwise`` with a value head dim below the query/key one (MLA):
    the padded stand-in's matmuls run at the matmul rate, not at the fused kernel's; XLA's traffic
    inside the stand-in stays uncounted (the HBM trace treats its scope as one boundary), an
    underestimate."""
    return dataclasses.replace(
        gi,
        fused_attention_flops_per_layer=0.0,
        base_recompute_fused_flops_per_layer=0.0,
        activations=tuple(
            dataclasses.replace(
                a,
                recompute_fused_flops_per_layer=0.0,
                fused_flops_made_per_layer=0.0,
                fused_flops_before_per_layer=0.0,
            )
            for a in gi.activations
        ),
    )


@_memoised
def model_inventory(cfg, microbatch: int, seq: int, mesh: dict | None = None) -> Inventory:
    """Inventory of a reference model, per device.

    ``microbatch`` is sequences per device; activations are batch-sharded, so each
    layer is traced at the per-device batch, with heads and MLP hidden sizes divided
    by ``tensor`` (:func:`tensor_shard_config`).  Parameters, gradients and AdamW
    moments follow the step's sharding rules (:func:`per_device_param_count`).
    The logits are float32, one ``cfg.loss_tiles``-th of [tokens, vocab] at a time.
    The layer traces are reused per local shape (:func:`_traced_groups`).
    """
    from tierax.mesh import MeshShape

    mesh = {"data": 1, "fsdp": 1, **(mesh or {})}
    shape = MeshShape(**mesh)
    shape.check_model(cfg)
    groups = []
    for gi, (path, wshape) in _traced_groups(cfg, microbatch, seq, shape.tensor):
        gi = shard_weight_work(gi, weight_ways(path, wshape, mesh))
        if _has_experts(cfg, gi.name):
            gi = widen_ring_rows(gi, moe.ring_rows_factor(cfg, shape.expert))
        by_axis = _forward_collective_bytes(cfg, gi.name, microbatch, seq, mesh)
        groups.append(
            dataclasses.replace(
                gi,
                forward_collective_bytes_per_layer=sum(b for _, b in by_axis),
                forward_collective_bytes_by_axis=by_axis,
            )
        )
    p_item = jnp.dtype(cfg.param_dtype).itemsize
    counts = per_device_group_param_counts(cfg, mesh)
    count = sum(counts.values())
    param_bytes = int(count * p_item)
    return Inventory(
        model=cfg.name,
        microbatch=microbatch,
        seq=seq,
        mesh=mesh,
        groups=tuple(groups),
        param_bytes=param_bytes,
        grad_bytes=param_bytes,
        optimizer_bytes=param_bytes * moment_bytes_per_param(cfg) // p_item,  # AdamW mu, nu
        logits_bytes=microbatch
        * seq
        * cfg.vocab_size
        * 4
        // cfg.loss_tiles,  # float32, one tile at a time
        embed_param_count=cfg.embedding_params(),
        loss_hbm_bytes=_loss_hbm_bytes(cfg, microbatch, seq) if cfg.vocab_size else 0.0,
        group_param_counts=tuple((g, c) for g, c in counts.items() if g is not None),
        moment_bytes_per_param=moment_bytes_per_param(cfg),
    )


def _loss_hbm_bytes(cfg, microbatch: int, seq: int) -> float:
    """The loss's non-matmul HBM bytes per device (the head's [D, V] weight gathered, in the compute
    dtype)."""
    dtype = jnp.dtype(cfg.dtype)
    return hbm.loss_bytes(
        jax.ShapeDtypeStruct((microbatch, seq, cfg.d_model), dtype),
        jax.ShapeDtypeStruct((cfg.d_model, cfg.vocab_size), dtype),
        jax.ShapeDtypeStruct((microbatch, seq), jnp.int32),
        cfg.loss_tiles,
    )


def for_plan(inv: Inventory, plan: plan_lib.Plan, cfg) -> Inventory:
    """``inv`` with each group that ``plan`` segments split into its segments (rows named
    ``group@A-B``, ``num_layers`` the segment's length), as the step runs them: one scan each."""
    segments = plan_lib.segments_of(plan, cfg)
    if not segments:
        return inv
    groups = []
    for g in inv.groups:
        for start, stop, name in segments.get(g.name, [(0, g.num_layers, g.name)]):
            n = stop - start
            acts = tuple(dataclasses.replace(a, group=name, num_layers=n) for a in g.activations)
            groups.append(dataclasses.replace(g, name=name, num_layers=n, activations=acts))
    return dataclasses.replace(inv, groups=tuple(groups))


def bytes_by_placement(
    inventory: Inventory | list[Activation], plan: plan_lib.Plan, cfg
) -> dict[str, int]:
    """Total named-activation bytes per placement (device / offload / remat) under ``plan``: the
    bytes the step holds (a value its backward never needs holds none, :class:`Activation`)."""
    placements = plan_lib.resolve(plan, cfg)
    if isinstance(inventory, Inventory):
        inventory = for_plan(inventory, plan, cfg)
    acts = inventory.activations() if isinstance(inventory, Inventory) else inventory
    out = {p.value: 0 for p in plan_lib.Placement}
    for a in acts:
        if a.group in placements and a.name in placements[a.group]:
            where = placements[a.group][a.name]
            off = where is plan_lib.Placement.OFFLOAD
            out[where.value] += (
                a.host_held_bytes_per_layer * a.num_layers if off else a.held_total_bytes
            )
    return out


def inventory_json(inv: Inventory) -> dict:
    """The ``tierax inventory --json`` object."""
    d = dataclasses.asdict(inv)
    for g in d["groups"]:
        for a in g["activations"]:
            a["total_bytes"] = a["bytes_per_layer"] * a["num_layers"]
    return d
