"""The mesh search's accumulation (issue 60's bug): a candidate accumulates over the smallest number
of microsteps k whose everything-recomputed floor fits beside the float32 accumulator — 4 bytes a
parameter whatever the parameter dtype.  Checked against the cost model's own peak with ``k``
microbatches per update (:func:`tierax.costmodel.evaluate` counts the accumulator in the
microbatches' phases), a second implementation of the same bytes, with bfloat16 parameters (where
one parameter shard is half the accumulator)."""

from __future__ import annotations

from tierax import costmodel as cm
from tierax.mesh import MeshShape
from tierax.models import apply_overrides, get_config
from tierax.plan import Placement
from tierax.solving import mesh_search
from tierax.tracing import inventory as inv_lib
from tierax.tracing.model_program import for_inventory

SEQ, GLOBAL_BATCH = 64, 64


def _smallest_fitting_k(cfg, rates, mesh: MeshShape, budget: float) -> int | None:
    microbatch = GLOBAL_BATCH // mesh.batch_ways
    for k in mesh_search.divisors(microbatch):
        inv = inv_lib.model_inventory(cfg, microbatch // k, SEQ, mesh.to_dict())
        remat = {(i.group, i.name): Placement.REMAT for i in cm.item_terms(inv, rates)}
        peak = cm.evaluate(
            remat, for_inventory(cfg, inv), rates, "lhs", grad_accum=k
        ).peak_device_bytes
        if peak <= budget:
            return k
    return None


def test_accumulation_reserves_the_float32_accumulator_with_bfloat16_parameters():
    cfg = apply_overrides(get_config("tiny-llama"), ["param_dtype=bfloat16"])
    rates = cm.target_rates("h200", cfg.dtype)
    mesh = MeshShape(data=8)  # every parameter on every device: the accumulator matters most
    count = inv_lib.per_device_param_count(cfg, mesh.to_dict())
    # a budget between the 2-microstep floor beside half the accumulator and beside all of it
    inv = inv_lib.model_inventory(cfg, GLOBAL_BATCH // 8 // 2, SEQ, mesh.to_dict())
    remat = {(i.group, i.name): Placement.REMAT for i in cm.item_terms(inv, rates)}
    floor2 = cm.evaluate(remat, for_inventory(cfg, inv), rates, "lhs").peak_device_bytes
    budget = floor2 + 3 * count  # above floor + 2·count (one bf16 shard), below floor + 4·count
    s = mesh_search.search(cfg, 8, rates, global_batch=GLOBAL_BATCH, seq=SEQ, budget_bytes=budget,
                           prune=False)  # fmt: skip
    cands = {c.mesh: c for c in s.candidates}
    assert cands[mesh].grad_accum == _smallest_fitting_k(cfg, rates, mesh, budget) == 4
    for m, c in cands.items():  # every candidate's accumulation is the smallest that fits
        if c.status.startswith("no fit") or not c.floor_fits:
            continue
        assert c.grad_accum == _smallest_fitting_k(cfg, rates, m, budget), m
    # the state bound: parameters, gradients and both AdamW moments in the parameter dtype
    assert cands[mesh].state_bytes == 4 * 2 * count
