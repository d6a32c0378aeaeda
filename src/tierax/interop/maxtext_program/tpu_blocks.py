"""MaxText's scanned blocks of several layers on a TPU: the weights one layer's backward holds
gathered under FSDP (:func:`gathered_weight_bytes`, the Program's ``gathered_weight_bytes``).

Several decoder families scan a block of layers rather than a layer: OLMo 3 (its three
sliding-window layers and one global, ``inhomogeneous_layer_cycle_interval``), GPT-OSS, Llama 4,
Gemma 3 (its six-layer attention pattern).  MaxText's parameter tree names the block's layers
``layers_0``, ``layers_1``, … under the stack, and the block is one ``jax.checkpoint`` unit: the
trace prices it as one layer of its group (:mod:`.trace`), whose workspace gathers every weight of
the scanned layer (:func:`tierax.costmodel.fixed._group_workspace`) — here every layer's of the
block at once.

XLA:TPU's program does not hold them together (read from XLA:TPU's, libtpu 0.0.52, optimized HLO,
buffer assignment and live ranges of ``tierax compile --maxtext`` with ``XLA_FLAGS=--xla_dump_to``).
Its SPMD partitioner makes one all-gather per use of a weight's shard: in the backward loop's body
one for the block's recomputed forward and one for the layer's backward; its all-gather CSE, which
weighs how far apart the two uses lie in the body (``xla_tpu_spmd_threshold_for_allgather_cse``),
merges the two for the block's last layer only, whose recomputation and backward are adjacent.
Every other layer's recomputation gathers its weights, uses them and frees them, and its backward
gathers them again where it uses them, one weight after another.  The body's peak is where the
block's backward starts: every layer's recomputed residuals (the workspace's written residuals,
the block's) and the last layer's gathered weights, kept from its recomputation — one layer's.
Read from olmo3-7b at 8 layers (two trips of its four-layer block, ``remat_policy=full``, fsdp 4,
1 × 1024) on v6e and on v5p, and gemma3-4b at 12 layers (two trips of its six-layer block, the same
policy and mesh) on v6e: in every one the backward body gathers the block's first layers' MLP and
attention kernels twice and its last layer's once.  The schedule is the generation's to choose:
gemma3-4b on v5p has the same gathers, but XLA:TPU issues each layer's backward gathers early,
beside its recomputation's (their operands, the layer's weight shards, prefetched into the chip's
alternate memory), so every layer's gathered weights are live at the body's peak, as the whole
block is priced.  Which programs the v5p schedule prefetches is not read, so the rule gives one
layer's weights only on the generations where every compile read did (:data:`ONE_LAYER_AT_A_TIME`)
and leaves the whole block elsewhere (the larger reading; v5e and TPU7x: no block compile read).

One layer's: the largest of the block's layers' gathered weights — the stacks a layer all-gathers
over its FSDP axes, still split over ``tensor`` as the trace counts them (norm scales are not
gathered), in the compute dtype; a layer's routed experts are left to the cost model's expert rules
(``expert_param_count_per_layer``, :mod:`.tpu_moe`).  A stack whose layer is a single layer (no
``layers_<i>`` in its tree) keeps the layer's own.
"""

from __future__ import annotations

import re

# The TPU generations whose scanned blocks' backward XLA:TPU (libtpu 0.0.52) compiled with one
# layer's weights gathered at a time in every compile read (module docstring).
ONE_LAYER_AT_A_TIME = ("v6e",)

# A layer of a scanned block in MaxText's parameter tree: decoder/<stack>/layers_<i>/...
_BLOCK_LAYER = re.compile(r"layers_(\d+)")


def block_layer(path: str) -> int | None:
    """The layer of its scanned block that the stack at ``path`` (``decoder/<stack>/layers_<i>/…``
    in MaxText's parameter tree) belongs to, ``i``; None for a stack whose layer is a single
    layer."""
    keys = path.split("/")
    m = _BLOCK_LAYER.fullmatch(keys[2]) if len(keys) >= 4 else None
    return int(m.group(1)) if m else None


def block_layer_elements(stacks) -> dict[str, dict[str, int]]:
    """Per group, per layer of its scanned block, the elements of the dense weights one device
    computes with (each stack's layer slice gathered over its FSDP axes, :meth:`.weight_stacks.Stack
    .gathered_layer_elements`), from MaxText's stacked weights ``stacks``
    (:func:`.weight_stacks.state_stacks`); a group whose stacks name no block layer is left out."""
    out: dict[str, dict[str, int]] = {}
    for s in stacks:
        i = block_layer(s.path)
        if i is None or s.is_expert or not s.gathered_dims():
            continue
        layers = out.setdefault(s.group, {})
        key = f"layers_{i}"
        layers[key] = layers.get(key, 0) + s.gathered_layer_elements()
    return {g: layers for g, layers in out.items() if len(layers) > 1}


def one_layer_bytes(layers: dict[str, dict[str, int]], compute_itemsize: int) -> tuple:
    """(group, bytes) for each group of ``layers`` (:func:`block_layer_elements`): its largest
    layer's gathered weights in the compute dtype."""
    return tuple((g, compute_itemsize * max(by.values())) for g, by in layers.items())


def applies(target: str | None) -> bool:
    """Whether XLA:TPU gathers a scanned block's weights one layer at a time on ``target``
    (:data:`ONE_LAYER_AT_A_TIME`)."""
    if target is None:
        return False
    from tierax import hardware

    spec = hardware.get_target(target)
    return spec.kind == "tpu" and getattr(spec, "generation", "") in ONE_LAYER_AT_A_TIME


def gathered_weight_bytes(config, inv, target: str | None) -> tuple[tuple[str, int], ...]:
    """The Program's ``gathered_weight_bytes`` for MaxText's ``config`` and its inventory ``inv``
    on ``target`` (module docstring): each scanned block's largest layer's gathered weights, where
    XLA:TPU gathers them one layer at a time on ``target`` and the weights are gathered (FSDP);
    none elsewhere."""
    import jax.numpy as jnp

    if not applies(target) or int(inv.mesh.get("fsdp", 1)) * int(inv.mesh.get("expert", 1)) <= 1:
        return ()
    from tierax.interop.maxtext_program import weight_stacks
    from tierax.interop.maxtext_program.abstract_state import abstract_state

    names = {g.name for g in inv.groups}
    stacks = weight_stacks.state_stacks(abstract_state(config), names)
    return one_layer_bytes(block_layer_elements(stacks), jnp.dtype(config.dtype).itemsize)
