"""What XLA:GPU holds of MaxText's stacked layer weights besides the training state: a relayout copy
of each FSDP-sharded weight stack, and, in a routed-expert layer's backward, the gathered expert
weights padded to the tiles of MaxText's megablox kernel run as a loop with copies of them for the
loop; and which stacks' gradients the layers' backward does not yet hold — all read from MaxText's
own abstract train state (its parameter tree: each weight's logical axes, its layer axis, its
dtype, its sharding on the run's mesh).

* **Relayout copies** (:func:`relayout_copies`, priced as the Program's ``stack_copy_params``;
  :mod:`.as_program` takes the routed-expert groups' from here, the other groups' from
  :mod:`.loss_terms`).
  MaxText stacks every layer weight on ``param_scan_axis`` (1 in base.yml: ``wi_0`` is
  ``[experts, layers, embed, mlp]``, ``query`` ``[embed, layers, heads, head_dim]``), while its
  layer scan reads one layer at a time along the leading axis and all-gathers it over the FSDP axes.
  XLA:GPU gathers along an array's major dimension, so before the forward loop it copies each stack
  it gathers into a layout with the layer axis and the gathered dimension major (one fusion per
  stack on the parameter, ``wrapped_transpose``), in the parameter dtype, sharded as stored, live
  until the backward loop ends.  A stack whose layer axis is already leading is copied only where a
  dimension of more than one element per device precedes its gathered one in a layer's slice
  (:mod:`tierax.sharding.gather_layout`'s rule for tierax's own stacks); a stack no FSDP axis
  shards (MaxText's norm scales) is read through a bitcast, not copied.  Seen in the deviceless
  XLA:GPU compiles of ``bench/maxtext_fidelity.py --dump-dir``: mixtral-8x7b-h200-full (all eight
  sharded stacks: ``query``/``key``/``value``/``out``, the router ``gate``, the experts'
  ``wi_0``/``wi_1``/``wo`` as ``f32[D/fsdp, L, E, F]``, 3 × 896 MiB), llama3-8b-h200-full and
  qwen3-8b-h200-minimal (all seven sharded stacks), and the small MoE config of
  ``tests/test_maxtext_weight_stacks.py``.  XLA:TPU makes no such copy (it converts the stacks to
  the compute dtype instead: :func:`tierax.costmodel.fixed._tpu_stack_copy_bytes`).
* **The expert kernel's padded weights and their loop copies** (:func:`gmm_weight_bytes`, added
  to the group's ``moe_backward_bytes`` beyond the gathered weights the cost model's workspace
  counts).  On a GPU MaxText runs its megablox grouped matmul (``sparse_matmul`` and ``megablox``,
  no tokamax) as the Pallas kernel interpreted (MaxText interprets it on any platform but a TPU):
  JAX's Pallas interpreter pads every operand to a multiple of its block (``jit(gmm)/jit(_pad)``),
  then runs an XLA while loop that carries the padded operands and writes each block it reads back
  into its carried operand.  The expert weight's block is the kernel's ``[tk, tn]`` tile
  (``[tn, tk]`` transposed): ``wi_0``/``wi_1`` ``[E, D, F]`` padded to ``wi_tile_fwd_embed_dim`` ×
  ``wi_tile_fwd_mlp_dim`` in the forward, ``wi_tile_dlhs_embed_dim`` × ``wi_tile_dlhs_mlp_dim`` in
  the backward's ``dlhs``; ``wo`` ``[E, F, D]`` by the ``wo_tile_*`` keys the same way (1024 each
  in base.yml).  Read from the deviceless XLA:GPU compiles of deepseek2-16b at 2 layers with
  ``attention=dot_product`` on 4 H200s (fsdp 4; experts of ``[64, 2048, 1408]`` held as
  ``bf16[64, 2048, 2048]``, 512 MiB where the gathered weight is 352; at 3 layers, its MoE stack of
  two layers looped, the same), mixtral-8x7b-h200-full (``[8, 4096, 14336]``: multiples of the
  tiles, no padding) and the small MoE configs of ``tests/test_maxtext_weight_stacks.py``: in the
  layer's backward XLA:GPU pads each gathered expert weight once (the recomputed forward's pad and
  the ``dlhs``'s are the same computation: one buffer; the gathered weight is dead once padded),
  and the two loops that read
  it (the recomputed forward and the ``dlhs``) both write into their carry, so it copies the padded
  weight for the first of them and the last reads it in place.  At the layer's peak (the second
  up-projection's recomputed loop) it holds the three padded weights and two padded copies: the
  running loop's and ``wo``'s, made before that loop for the ``dlhs`` that follows it (deepseek2:
  ``copy.718``, ``copy.694``; mixtral: ``copy.572`` carried by the loop, ``copy.548``).  Per
  device, in the compute dtype: each expert weight's layer slice gathered (its local experts: the
  ``exp`` dimension ÷ the expert axis; the other dimensions whole but for the tensor axis), each
  ``embed``/``mlp`` dimension rounded up to its tile; the copies are the two largest.  The weight
  gradients' loops (``tgmm``) carry a padded weight-sized output each, after the padded weights are
  dead (not the layer's peak: not priced).  Not traced: forward and ``dlhs`` tiles that pad a
  weight differently (two pads, no shared buffer; priced as the larger), MaxText's pre-fused
  ``wi`` (``prefuse_moe_weights``), quantized experts; the tokens' padding to
  ``*_tile_*_batch_seq`` and the activations' to the tiles (dispatch-sized) is not priced.
* **Single-trip stacks' gradients** (:func:`single_trip_grad_params`, the Program's
  ``late_grad_bytes`` on a GPU).  A routed-expert stack of one layer (DeepSeek's ``moe_layers`` at
  2 layers) runs no layer loop: XLA:GPU computes its weight gradients (the ``tgmm`` loops, the
  attention's) after the layer's recomputed forward and ``dlhs`` loops, once the padded weights are
  dead, so the layer's peak holds none of the stack's gradients (deepseek2-16b's dump above: no
  float32 weight gradient live at the peak; the experts' are written from the ``tgmm`` loops on).
  A stack that loops (two layers or more) accumulates its gradients in the loop: held throughout
  (deepseek2-16b at 3 layers: its MoE stack's float32 accumulators live at the layer's peak).

MaxText names a stack's layer axis ``layers`` or after the stack (DeepSeek's ``dense_layers``,
``moe_layers``): :func:`state_stacks` reads either.  A one-layer stack (no layer loop) is read
whole: no relayout copy (deepseek2-16b's dump above: no float32 copy of a stack before the
forward; at 3 layers the two-layer MoE stack's are made, ``f32[512, 2, 64, 1408]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Mesh axes MaxText's layers all-gather their weights over (its FSDP axes; ``expert`` shards the
# experts' own dimension, which stays sharded: expert parallelism).  MaxText's tensor axes keep
# their shards.
GATHERED_AXES = ("fsdp", "fsdp_transpose", "expert")
# MaxText's logical name of the layer axis (DeepSeek's stacks name it after the stack instead:
# ``dense_layers``, ``moe_layers``) and of the experts' dimension.
LAYERS = "layers"
EXPERTS = "exp"
# The expert weights' dimensions the megablox kernel tiles, by the word in their logical names
# (``embed_moe``, ``mlp_moe``) and the word in MaxText's tile keys (``wi_tile_fwd_embed_dim``).
TILED = (("embed", "embed_dim"), ("mlp", "mlp_dim"))


@dataclass(frozen=True)
class Stack:
    """One stacked layer weight of MaxText's train state as one device holds it: its path, its
    logical axis names, the mesh axes (of more than one device) sharding each dimension, its
    per-device shape and dtype."""

    path: str
    group: str
    names: tuple[str | None, ...]
    axes: tuple[tuple[str, ...], ...]
    local_shape: tuple[int, ...]
    dtype: str
    mesh: tuple[tuple[str, int], ...]

    @property
    def layer_axis(self) -> int:
        return self.names.index(LAYERS if LAYERS in self.names else self.group)

    @property
    def layers(self) -> int:
        return self.local_shape[self.layer_axis]

    @property
    def itemsize(self) -> int:
        import numpy as np

        return np.dtype(self.dtype).itemsize

    @property
    def local_bytes(self) -> int:
        return math.prod(self.local_shape) * self.itemsize

    @property
    def is_expert(self) -> bool:
        return EXPERTS in self.names

    def gathered_axes(self, d: int) -> tuple[str, ...]:
        """The mesh axes a layer's slice is all-gathered over along dimension ``d``: its FSDP axes
        (the experts' dimension stays sharded over ``expert``: expert parallelism; the layer axis
        is sliced, not gathered)."""
        if d == self.layer_axis:
            return ()
        return tuple(
            a
            for a in self.axes[d]
            if a in GATHERED_AXES and not (a == "expert" and self.names[d] == EXPERTS)
        )

    def gathered_dims(self) -> list[int]:
        """The dimensions a layer's slice is all-gathered along, in order."""
        return [d for d in range(len(self.local_shape)) if self.gathered_axes(d)]

    def gathered_layer_shape(self) -> dict[int, int]:
        """One layer's slice as the layer computes with it, dimension → size: gathered along
        :meth:`gathered_dims`, still split over the other axes (the layer axis left out)."""
        sizes = dict(self.mesh)
        return {
            d: n * math.prod(sizes[a] for a in self.gathered_axes(d))
            for d, n in enumerate(self.local_shape)
            if d != self.layer_axis
        }

    def gathered_layer_elements(self) -> int:
        """Elements of :meth:`gathered_layer_shape`."""
        return math.prod(self.gathered_layer_shape().values())


def needs_relayout_copy(stack: Stack) -> bool:
    """Whether XLA:GPU copies ``stack`` into a layer-major, gathered-dimension-major layout before
    the forward loop (module docstring): it is gathered, of more than one layer (a one-layer stack
    runs no loop), and either its layer axis is not leading or a dimension of more than one element
    per device precedes the first gathered one."""
    gathered = stack.gathered_dims()
    if not gathered or stack.layers == 1:
        return False
    if stack.layer_axis != 0:
        return True
    before = [stack.local_shape[d] for d in range(gathered[0]) if d != stack.layer_axis]
    return any(n > 1 for n in before)


def relayout_copies(stacks) -> list[Stack]:
    """The stacks XLA:GPU copies before the forward loop (:func:`needs_relayout_copy`)."""
    return [s for s in stacks if needs_relayout_copy(s)]


def relayout_copy_bytes(stacks) -> int:
    """Per device, the bytes of XLA:GPU's relayout copies of ``stacks`` (each as stored: its
    shard, its dtype)."""
    return sum(s.local_bytes for s in relayout_copies(stacks))


def runs_interpreted_gmm(config) -> bool:
    """Whether MaxText's MoE layer computes its experts with the megablox kernel, which it runs
    interpreted (an XLA loop) on a GPU: dropless dispatch (``sparse_matmul``) with ``megablox`` and
    without tokamax's kernels."""
    return (
        int(getattr(config, "num_experts", 1) or 1) > 1
        and bool(config.sparse_matmul)
        and bool(config.megablox)
        and not bool(getattr(config, "use_tokamax_gmm", False))
    )


def _round_up(n: int, tile: int) -> int:
    return -(-n // tile) * tile


def _padded_elements(config, stack: Stack, pass_: str) -> int:
    """Elements of ``stack``'s gathered layer slice padded to the megablox kernel's tiles of
    ``pass_`` (``fwd`` or ``dlhs``): each ``embed``/``mlp`` dimension rounded up to its tile key
    (``wi_tile_*`` for ``wi_0``/``wi_1``, ``wo_tile_*`` for ``wo``)."""
    weight = stack.path.rpartition("/")[2]
    prefix = "wo" if weight.startswith("wo") else "wi"
    out = 1
    for d, n in stack.gathered_layer_shape().items():
        name = stack.names[d] or ""
        for word, key in TILED:
            if word in name:
                n = _round_up(n, int(getattr(config, f"{prefix}_tile_{pass_}_{key}")))
                break
        out *= n
    return out


def padded_weight_elements(config, stack: Stack) -> int:
    """Elements XLA:GPU holds of ``stack``'s padded gathered layer slice in the layer's backward
    (module docstring): its forward pad, which the ``dlhs`` shares; the larger of the two where
    their tiles pad it differently (not traced)."""
    return max(_padded_elements(config, stack, p) for p in ("fwd", "dlhs"))


def kernel_weights(stacks, group: str) -> list[Stack]:
    """``group``'s expert weights the megablox kernel multiplies by: its stacks naming the experts'
    dimension that the layer all-gathers (the kernels, not the biases)."""
    return [s for s in stacks if s.group == group and s.is_expert and s.gathered_dims()]


def gmm_weight_bytes(config, stacks, group: str) -> int:
    """Per device, the bytes XLA:GPU holds in ``group``'s backward for MaxText's interpreted
    megablox kernel beyond the gathered expert weights (module docstring): the weights padded to
    the kernel's tiles (less the gathered weights, which the cost model's workspace counts) and two
    padded copies (the two largest), in the compute dtype; 0 where the layer does not run that
    kernel or has no expert weight."""
    import numpy as np

    if not runs_interpreted_gmm(config):
        return 0
    weights = kernel_weights(stacks, group)
    if not weights:
        return 0
    item = np.dtype(config.dtype).itemsize
    padded = sorted((padded_weight_elements(config, s) for s in weights), reverse=True)
    gathered = sum(s.gathered_layer_elements() for s in weights)
    return item * (sum(padded) - gathered + sum(padded[:2]))


def single_trip_grad_params(config, stacks, group_params: dict[str, int], groups) -> float:
    """Per device, the parameters whose gradients XLA:GPU writes after the layers' backward peak
    (module docstring): every parameter of the routed-expert ``groups`` whose stacks hold one layer
    under MaxText's scan (``scan_layers``); ``group_params``: each group's parameters per device."""
    if not bool(config.scan_layers):
        return 0.0
    single = {s.group for s in stacks if s.group in set(groups) and s.layers == 1}
    return float(sum(group_params.get(g, 0) for g in single))


def expert_params_per_layer(stacks, group: str) -> int:
    """The routed experts' parameters of one layer of ``group`` (one scanned layer or block) over
    all its experts, as the whole mesh holds them: every stack of ``group`` whose logical axes name
    the experts' dimension (MaxText shards it over ``expert``: a device computes with its
    ``E / expert`` local experts, :func:`tierax.costmodel.fixed._group_workspace`), its layer slice
    unsharded."""
    out = 0
    for s in stacks:
        if s.group != group or not s.is_expert:
            continue
        sizes = dict(s.mesh)
        out += math.prod(
            n * math.prod(sizes[a] for a in s.axes[d])
            for d, n in enumerate(s.local_shape)
            if d != s.layer_axis
        )
    return out


def state_stacks(state, groups) -> list[Stack]:
    """The stacked layer weights of MaxText's abstract train state ``state`` (its model's
    parameters) in the decoder stacks named ``groups``: every parameter whose logical axes name
    MaxText's layer axis."""
    import jax
    from flax import nnx

    params = nnx.state(state.model, nnx.Param)
    leaves = jax.tree_util.tree_leaves_with_path(
        params, is_leaf=lambda v: isinstance(v, nnx.Variable)
    )
    out = []
    for path, var in leaves:
        if not isinstance(var, nnx.Variable):
            continue
        keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
        if len(keys) < 2 or keys[0] != "decoder" or keys[1] not in groups:
            continue
        meta = var.get_metadata()
        names = tuple(meta.get("out_sharding") or meta.get("sharding_names") or ())
        value = var.get_value()
        if (LAYERS not in names and keys[1] not in names) or len(names) != len(value.shape):
            continue
        sharding = value.sharding
        sizes = dict(sharding.mesh.shape)
        spec = tuple(sharding.spec) + (None,) * (len(value.shape) - len(sharding.spec))
        axes = tuple(
            tuple(a for a in ((e,) if isinstance(e, str) else (e or ())) if sizes.get(a, 1) > 1)
            for e in spec
        )
        out.append(
            Stack(
                path="/".join(keys),
                group=keys[1],
                names=names,
                axes=axes,
                local_shape=tuple(int(n) for n in sharding.shard_shape(value.shape)),
                dtype=str(value.dtype),
                mesh=tuple((a, int(n)) for a, n in sizes.items()),
            )
        )
    return out


@dataclass(frozen=True)
class GpuTerms:
    """The Program's figures of XLA:GPU's copies of MaxText's weight stacks, per device."""

    copy_params: float  # stack_copy_params: the relayout copies, in parameters of param_dtype
    gmm_bytes: tuple[tuple[str, int], ...]  # per group: the expert kernel's padded weights, copies
    late_grad_bytes: int = 0  # the single-trip routed-expert stacks' gradients (grad_dtype)

    def gmm(self, group: str) -> int:
        return dict(self.gmm_bytes).get(group, 0)


def gpu_terms(config, groups, group_params: dict[str, int] | None = None) -> GpuTerms:
    """:class:`GpuTerms` of the MaxText config ``config`` whose routed-expert decoder stacks are
    ``groups``, read from MaxText's abstract train state on the run's mesh; ``group_params``: each
    group's parameters per device (the inventory's ``group_param_counts``; none: no late
    gradients)."""
    import numpy as np

    from tierax.interop.maxtext_program.abstract_state import abstract_state

    stacks = state_stacks(abstract_state(config), set(groups))
    param_item = np.dtype(config.weight_dtype).itemsize
    late = single_trip_grad_params(config, stacks, dict(group_params or {}), groups)
    return GpuTerms(
        copy_params=relayout_copy_bytes(stacks) / param_item,
        gmm_bytes=tuple((g, gmm_weight_bytes(config, stacks, g)) for g in groups),
        late_grad_bytes=int(late * np.dtype(config.grad_dtype).itemsize),
    )
