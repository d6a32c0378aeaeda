"""What XLA:GPU holds of MaxText's stacked layer weights besides the training state: a relayout copy
of each FSDP-sharded weight stack, and, in a routed-expert layer's backward, a copy of a gathered
expert weight for MaxText's megablox kernel run as a loop — both read from MaxText's own abstract
train state (its parameter tree: each weight's logical axes, its layer axis, its dtype, its
sharding on the run's mesh).

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
* **The expert kernel's loop copy** (:func:`gmm_loop_copy_bytes`, added to the group's
  ``moe_backward_bytes``).  On a GPU MaxText runs its megablox grouped matmul (``sparse_matmul``
  and ``megablox``, no tokamax) as the Pallas kernel interpreted (MaxText interprets it on any
  platform but a TPU): an XLA while loop that carries its operands, the gathered expert weight
  among them.  A gathered weight that another of the layer's loops reads as well (the recomputed
  forward and the backward's ``dlhs`` read the same ``wi_0``, ``wi_1``, ``wo``) is copied into the
  loop, so beside the three gathered expert weights of the layer's backward XLA:GPU holds at least
  one more: one in mixtral-8x7b-h200-full (``copy`` of an ``all-gather-done``, ``bf16[8, 4096,
  14336]``); smaller compiles of the same layer hold two (the test's config; at d 2048, 4 experts
  of 4096 also the weight gradient's compute-dtype accumulator), a schedule choice of XLA's
  latency-hiding scheduler at those sizes that the model does not follow: the term is the one copy
  every compile seen holds.  Sized as the layer's largest expert weight gathered: its local experts
  (the ``exp`` dimension ÷ the expert axis), the other dimensions whole but for the tensor axis, in
  the compute dtype.  Where a dimension does not divide the kernel's tiles (``wi_tile_*``,
  ``wo_tile_*``, 1024 in base.yml; e.g. qwen3-30b-a3b's experts of 768) the kernel pads the weight
  and XLA holds padded copies besides: not priced (not traced).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Mesh axes MaxText's layers all-gather their weights over (its FSDP axes; ``expert`` shards the
# experts' own dimension, which stays sharded: expert parallelism).  MaxText's tensor axes keep
# their shards.
GATHERED_AXES = ("fsdp", "fsdp_transpose", "expert")
# MaxText's logical name of the layer axis and of the experts' dimension.
LAYERS = "layers"
EXPERTS = "exp"


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
        return self.names.index(LAYERS)

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

    def gathered_layer_elements(self) -> int:
        """Elements of one layer's slice as the layer computes with it: gathered along
        :meth:`gathered_dims`, still split over the other axes."""
        sizes = dict(self.mesh)
        return math.prod(
            n * math.prod(sizes[a] for a in self.gathered_axes(d))
            for d, n in enumerate(self.local_shape)
            if d != self.layer_axis
        )


def needs_relayout_copy(stack: Stack) -> bool:
    """Whether XLA:GPU copies ``stack`` into a layer-major, gathered-dimension-major layout before
    the forward loop (module docstring): it is gathered, and either its layer axis is not leading
    or a dimension of more than one element per device precedes the first gathered one."""
    gathered = stack.gathered_dims()
    if not gathered:
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


def gmm_loop_copy_bytes(config, stacks, group: str) -> int:
    """Per device, the copy of one gathered expert weight XLA:GPU holds in ``group``'s backward
    for MaxText's interpreted megablox loop (module docstring): the group's largest expert stack's
    layer slice, gathered, in the compute dtype; 0 where the layer does not run that kernel or has
    no expert stack."""
    import numpy as np

    if not runs_interpreted_gmm(config):
        return 0
    experts = [s for s in stacks if s.group == group and s.is_expert]
    if not experts:
        return 0
    item = np.dtype(config.dtype).itemsize
    return max(s.gathered_layer_elements() for s in experts) * item


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
        if LAYERS not in names or len(names) != len(value.shape):
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
    gmm_copy_bytes: tuple[tuple[str, int], ...]  # per group: the expert kernel's loop copy

    def gmm_copy(self, group: str) -> int:
        return dict(self.gmm_copy_bytes).get(group, 0)


def gpu_terms(config, groups) -> GpuTerms:
    """:class:`GpuTerms` of the MaxText config ``config`` whose decoder stacks are ``groups``, read
    from MaxText's abstract train state on the run's mesh."""
    import numpy as np

    from tierax.interop.maxtext_program.trace import _abstract_state

    stacks = state_stacks(_abstract_state(config), set(groups))
    param_item = np.dtype(config.weight_dtype).itemsize
    return GpuTerms(
        copy_params=relayout_copy_bytes(stacks) / param_item,
        gmm_copy_bytes=tuple((g, gmm_loop_copy_bytes(config, stacks, g)) for g in groups),
    )
