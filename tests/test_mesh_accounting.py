"""``plan --mesh auto``'s accounting, against what is computed here: under gradient accumulation
(a candidate's k microsteps and one update: tokens/s over the whole step, the accumulator in its
peak, its bounds and collectives for k microsteps, the smallest k whose floor fits), and a ranking
worked out by hand from the collective bytes when the links are slow enough to decide it."""

from __future__ import annotations

import pytest
from gpu_budget import hbm_size

from tierax import costmodel as cm
from tierax import plan as P
from tierax.models import get_config
from tierax.solving import mesh_search, planner
from tierax.tracing import inventory as inv_lib
from tierax.tracing.model_program import for_inventory

GB, SEQ = 16, 128
# A budget that makes tensor meshes accumulate: 4.83 MB for the model's own buffers beside XLA:GPU's
# fixed bytes (by jaxlib release; 9.5 MB of device memory when those were 4 MiB).
LLAMA_RATES = ["gpus_per_domain=4", hbm_size(4_830_696)]


@pytest.fixture(scope="module")
def accumulated():
    cfg = get_config("tiny-llama")
    rates = cm.override_rates(cm.target_rates("h200", cfg.dtype), LLAMA_RATES)
    s = mesh_search.search(cfg, 8, rates, global_batch=GB, seq=SEQ, prune=False)
    return cfg, rates, s


def test_an_accumulating_candidate_is_priced_as_k_microsteps(accumulated):
    """k microbatches per update: k microsteps less the update, the update once, the float32
    accumulator's additions (all by hand from the one-microbatch prediction of the same plan), the
    accumulator in the peak; tokens/s over the whole step."""
    cfg, rates, s = accumulated
    budget, _ = planner.budgets(rates, None, None)
    acc = [c for c in s.ranked if c.grad_accum > 1]
    assert acc, "the fixture must reach accumulation"
    for c in acc:
        k = c.grad_accum
        assert c.microbatch * k == GB // c.mesh.batch_ways
        inv = inv_lib.model_inventory(cfg, c.microbatch, SEQ, c.mesh.to_dict())
        assert not c.result.plan.offloads_state  # the hand sums below hold without state copies
        assert c.result.plan.grad_accum == k
        one = cm.simulate(
            c.result.plan, for_inventory(cfg, inv), rates, "lhs"
        )  # one microbatch per update
        hbm = rates.hbm_bytes_per_s
        update = 7 * inv.param_bytes / hbm  # AdamW: 7 × the parameters' bytes (float32)
        adds = k * (inv.param_bytes // 4) * (4 + 4 + 4) / hbm  # read sum and gradient, write sum
        step = k * (one.step_time_s - update) + update + adds
        assert c.step_time_s == pytest.approx(step, rel=1e-12)
        assert c.tokens_per_s(GB * SEQ) == pytest.approx(GB * SEQ / step, rel=1e-12)
        assert c.to_json(GB * SEQ)["tokens_per_s"] == pytest.approx(GB * SEQ / step)
        # The accumulator (one float32 gradient per parameter) is in the peak, within the budget.
        peak = c.result.predicted.peak_device_bytes
        assert peak - one.peak_device_bytes == inv.param_bytes
        assert peak <= budget
        # The floor's bound: the budget less the accumulator.
        assert c.budget_bytes == budget - inv.grad_bytes
        # Bounds and collectives for the whole optimizer step: k microsteps, one update.
        fx = cm.fixed_terms(for_inventory(cfg, inv), rates, "lhs")
        bound = k * (fx.compute_s + fx.exposed_collective_s) - (k - 1) * update
        assert c.lower_bound_s == pytest.approx(bound)
        assert c.lower_bound_s <= c.step_time_s
        per_micro = cm.collective_s_by_group(for_inventory(cfg, inv), rates)
        assert c.collectives == pytest.approx({g: k * v for g, v in per_micro.items()})
        # k is the smallest accumulation whose everything-recomputed floor fits.
        mb = GB // c.mesh.batch_ways
        for j in (j for j in range(1, k) if mb % j == 0):
            inv_j = inv_lib.model_inventory(cfg, mb // j, SEQ, c.mesh.to_dict())
            floor = cm.simulate(
                P.preset("remat-full", cfg), for_inventory(cfg, inv_j), rates, "lhs"
            )
            limit = budget - (inv_j.grad_bytes if j > 1 else 0)
            assert floor.peak_device_bytes > limit, (c.mesh, j)
    # Ranked by tokens/s over whole optimizer steps.
    tps = [c.tokens_per_s(GB * SEQ) for c in s.ranked]
    assert tps == sorted(tps, reverse=True)


# tiny-llama's parameters by hand: embedding and head 256 × 64 each, the final norm 64; per layer
# q 64×64, k and v 64×32, o 64×64, gate/up/down 3 × 64×128, two norms of 64.
PARAMS = 2 * 256 * 64 + 64 + 4 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64)
RATE = 1e6  # bytes/s per direction: collectives take seconds, compute microseconds


@pytest.mark.parametrize(
    "global_batch, seq, order",
    [
        # Two devices, float32.  data=2: all-reduce 2 · 4P · 1/2 = 4P bytes; fsdp=2: AG fwd, AG bwd
        # and RS of 4P · 1/2 each = 6P; tensor=2 (the whole batch on each): 2 ring all-reduces per
        # layer, 2 · (1/2) · tokens · 64 · 4 B each, forward and backward, 4 layers = 4096 · tokens.
        # P = 180,800: 4P = 723,200 B, 6P = 1,084,800 B.
        (8, 32, ["data", "tensor", "fsdp"]),  # tensor: 4096 · 256 tokens = 1,048,576 B
        (4, 32, ["tensor", "data", "fsdp"]),  # tensor: 4096 · 128 tokens = 524,288 B
    ],
)
def test_slow_links_rank_the_meshes_by_the_bytes_each_sends(global_batch, seq, order):
    cfg = get_config("tiny-llama")
    assert inv_lib.per_device_param_count(cfg, {"data": 1, "fsdp": 1}) == PARAMS == 180_800
    rates = cm.override_rates(
        cm.target_rates("h200", cfg.dtype), [f"interconnect={RATE / 1e9}", "scale_out=0.001"]
    )
    s = mesh_search.search(cfg, 2, rates, global_batch=global_batch, seq=seq, prune=False)
    tokens = global_batch * seq
    sent = {
        "data": 4 * PARAMS,
        "fsdp": 6 * PARAMS,
        "tensor": 2 * (2 * 2 * (1 / 2) * tokens * 64 * 4) * 4,
    }
    assert sent["tensor"] == {8: 1_048_576, 4: 524_288}[global_batch]
    got = [next(a for a in ("data", "fsdp", "tensor") if getattr(c.mesh, a) == 2) for c in s.ranked]
    assert got == order
    for c, axis in zip(s.ranked, got, strict=True):
        assert c.grad_accum == 1
        # tokens/s from the bytes alone, within the compute the links leave exposed (< 1 %)
        assert c.tokens_per_s(tokens) == pytest.approx(tokens * RATE / sent[axis], rel=0.01)
