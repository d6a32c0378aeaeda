"""MaxText's dense decoder on a TPU where its one scanned stack makes a single trip: what XLA:TPU
holds at the loss then that a layer loop does not (:func:`loss_bytes`, added to the Program's
``loss_bytes``).

MaxText scans its decoder stack (``scan_layers``) and wraps the scanned layer — or block of layers:
OLMo 3 scans blocks of four, Gemma 3 of six, and a Gemma 3 cut below six layers is one remainder
block — in ``jax.checkpoint`` with ``prevent_cse=False`` (:mod:`.tpu_moe`).  Where the cut model is
one block, the scan makes one trip and XLA:TPU inlines it: the forward, the recomputation and the
backward are one straight-line computation, and the recomputation, free to be merged with the
forward it repeats, is: the backward reads the forward's own values.  Read from XLA:TPU's (libtpu
0.0.52) buffer assignment and live ranges of olmo3-7b at 4 layers (one trip of its 4-layer block,
``remat_policy=full``, fsdp 4, 1 × 1024, v6e; ``bench/maxtext_fidelity.py --dump-dir``), whose
loss holds the buffers below; gemma3-4b at 2 layers (``remat_policy=minimal``, the same mesh) holds
its last layer's gathered MLP kernels from the forward through the loss too, but its top is a
layout (below, not priced).  At the loss, besides what the looped
reading prices there (the gathered head, the logits, the stack copies, the plan's kept activations),
the straight-line program holds:

* **The trip's residuals** (:func:`residual_bytes`).  Every residual the block's backward reads is
  the forward's value, live from the forward through the loss into the backward, as the layer phase
  counts them while a looped layer is recomputed (the group's written residuals,
  :func:`tierax.tracing.hbm.written_residual_bytes`), the whole block's.  A name the plan keeps on
  device that is one of them (``read_in_place``) is counted once, in the kept activations
  (:mod:`tierax.costmodel.kept_reads`); the layer input (the scan's carry) stays in both, as the
  layer phase counts it.  The plan does not change the program much: the olmo3-7b 4-layer step under
  ``full``, save-all and a q/k/v offload compiles to peaks within 0.3 % of each other.
* **The last layer's gathered weights** (:func:`last_layer_gathered_bytes`).  The block's last
  layer's FSDP-gathered dense kernels (its MLP's and attention output's in the dumps) are gathered
  in the forward and read by its backward: one all-gather, live from the forward through the loss,
  as :mod:`.tpu_moe` reads the last routed layer's experts.  Per device, the last layer's dense
  stacks gathered over FSDP (split over ``tensor``), in the compute dtype, the whole layer's (the
  dumps' query/key/value kernels are gathered again in the backward: an over-count of them).

Only where every layer stack of the decoder is a dense single-trip stack (the whole cut model is
one block): the routed-expert single trips are :mod:`.tpu_moe`'s (XLA keeps only part of their
written residuals: gpt-oss-20b-v5p-full), and a decoder with a single-trip stack beside another
(deepseek2's dense and MoE stacks) was not read.  A stack that loops (two trips or more) keeps the
recomputation apart (every multi-trip compile read): nothing is added.

Not priced (seen, no rule): XLA's temp is its assignment's highest offset, and the straight-line
program's assignment leaves gaps above the live set at the loss (olmo3-7b at 4 layers); with a tied
head (gemma3-4b at 2 layers) the embedding's gradient, scatter-added into its bf16 shard after the
layers' backward, takes the bottom of the gathered table's freed slot, and the head's gradient,
which no longer fits there, is placed above the logits-sized buffer held from the loss: XLA's top is
then the loss's forward buffers, the table's slot, one logits-sized buffer and the head's gradient.
"""

from __future__ import annotations

from tierax import names as N
from tierax.interop.maxtext_program import tpu_blocks


def single_trip_group(inv, scan_layers: bool, moe_groups=()) -> object | None:
    """The decoder's one layer group where it is a dense stack whose scan makes a single trip
    (module docstring: one group, one scanned layer or block, no routed experts, ``scan_layers``);
    None otherwise."""
    if not scan_layers or len(inv.groups) != 1:
        return None
    (group,) = inv.groups
    if group.num_layers != 1 or group.name in set(moe_groups):
        return None
    return group


def residual_bytes(group, placements: dict) -> int:
    """The trip's residuals the loss holds beyond the plan's kept activations (module docstring):
    the group's written residuals less the bytes of the names ``placements`` (name → where, as
    :func:`.as_program.policy_plan`'s values: ``"device"``, ``"offload"``, ``"remat"``) keeps on
    device that are read in place, the layer input left in."""
    kept = sum(
        int(a.logical_held_bytes_per_layer)
        for a in group.activations
        if a.read_in_place
        and a.name != N.DECODER_LAYER_INPUT
        and placements.get(a.name) == "device"
    )
    return max(0, int(group.written_residual_bytes_per_layer) - kept)


def last_layer_elements(stacks, group: str) -> int:
    """Elements of the dense weights one device computes with in the last layer of ``group``'s
    scanned layer or block, from MaxText's stacked weights ``stacks``
    (:func:`.weight_stacks.state_stacks`): each FSDP-gathered stack's layer slice
    (:meth:`.weight_stacks.Stack.gathered_layer_elements`), routed experts and norm scales left
    out."""
    by_layer: dict[int, int] = {}
    for s in stacks:
        if s.group != group or s.is_expert or not s.gathered_dims():
            continue
        layer = tpu_blocks.block_layer(s.path) or 0  # a stack of single layers: the layer's own
        by_layer[layer] = by_layer.get(layer, 0) + s.gathered_layer_elements()
    return by_layer[max(by_layer)] if by_layer else 0


def last_layer_gathered_bytes(config, group: str, fsdp: int) -> int:
    """The last layer's gathered dense weights in the compute dtype, per device (module
    docstring); 0 without FSDP (nothing gathered)."""
    import jax.numpy as jnp

    if fsdp <= 1:
        return 0
    from tierax.interop.maxtext_program import weight_stacks
    from tierax.interop.maxtext_program.abstract_state import abstract_state

    stacks = weight_stacks.state_stacks(abstract_state(config), {group})
    return int(jnp.dtype(config.dtype).itemsize * last_layer_elements(stacks, group))


def loss_bytes(config, inv, placements: dict, moe_groups=()) -> int:
    """What MaxText's single-trip dense decoder holds at the loss on a TPU beyond the looped
    reading (module docstring), per device; 0 where the decoder is not one dense single-trip
    stack.  ``placements``: the group's names and where MaxText's policy puts them."""
    group = single_trip_group(inv, bool(config.scan_layers), moe_groups)
    if group is None:
        return 0
    fsdp = int(inv.mesh.get("fsdp", 1)) * int(inv.mesh.get("expert", 1))
    return residual_bytes(group, placements) + last_layer_gathered_bytes(config, group.name, fsdp)
