"""An inventory is a pytree whose leaves are the fields that grow with the microbatch
(:data:`tierax.tracing.inventory.PER_MICROBATCH`); the planner's microbatch search extrapolates
one with a single ``jax.tree.map`` (:func:`tierax.solving.planner._scaled`).  Checked against the
real trace at the extrapolated microbatch (a dense model's activations are exactly ∝ batch)."""

from __future__ import annotations

import jax

from tierax.models import get_config
from tierax.solving import planner
from tierax.tracing import inventory as inv_lib

# What the planner's memory rows read of a microbatch (bytes) and its recomputation (FLOPs).
GROWS = (
    "carry_bytes_per_layer",
    "save_all_bytes_per_layer",
    "written_residual_bytes_per_layer",
    "base_recompute_flops_per_layer",
    "forward_flops_per_layer",
)


ACT_GROWS = (
    "bytes_per_layer",
    "recompute_flops_per_layer",
    "logical_bytes_per_layer",
    "host_bytes_per_layer",
    "host_value_bytes_per_layer",
    "flops_made_per_layer",
    "fused_flops_made_per_layer",
    "flops_before_per_layer",
    "fused_flops_before_per_layer",
)


def test_extrapolated_inventory_equals_the_trace_at_that_microbatch():
    cfg = get_config("tiny-llama")
    one, two, four = (inv_lib.model_inventory(cfg, mb, 16) for mb in (1, 2, 4))
    got = planner._scaled(one, two, 4)
    assert got.microbatch == 4 and got.logits_bytes == four.logits_bytes == 4 * one.logits_bytes
    for g, want in zip(got.groups, four.groups, strict=True):
        for field in GROWS:
            assert getattr(g, field) == getattr(want, field) != getattr(one.group(g.name), field)
        for a, b in zip(g.activations, want.activations, strict=True):
            assert [getattr(a, f) for f in ACT_GROWS] == [getattr(b, f) for f in ACT_GROWS]
            assert a.flops_before_per_layer > 0 or a.name in ("decoder_layer_input", "query_proj")
    # the leaves are those fields (an activation's bytes, its recomputation, its logical bytes where
    # its stack takes more, its host bytes, its largest one value's where a layer tags the name
    # more than once, the FLOPs before its making and its producer), the rest the structure:
    # a constant field is the first trace's
    assert len(jax.tree.leaves(one)) == 2 + len(one.groups) * len(GROWS) + len(ACT_GROWS) * len(
        one.activations()
    )
    assert jax.tree.structure(got) == jax.tree.structure(one)
