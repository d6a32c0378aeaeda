"""The CPU GEMM rate by a GEMM's smallest dimension, against hand computation: which dimension a
traced matmul reports (plain, batched attention-like, grouped), the FLOPs a layer splits into,
the rate curve's interpolation and its harmonic blend, and the terms of ``simulate`` that price
each group's GEMMs at its blend (forward, backward, recomputation) while the LM head keeps its
own rate.  Dropping the dimensions anywhere on the way fails a test here.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

from tierax import costmodel as cm
from tierax import names as N
from tierax import plan as P
from tierax.measure import calibrate, harness
from tierax.models import get_config
from tierax.tracing import jaxpr_tools
from tierax.tracing.inventory import Activation, GroupInventory, Inventory, model_inventory
from tierax.tracing.model_program import for_inventory

MB = 1_000_000


def _eqns(fn, *shapes, dtype=jnp.float32):
    args = [jax.ShapeDtypeStruct(s, dtype) for s in shapes]
    closed = jax.make_jaxpr(fn)(*args)
    return closed, [e for e in closed.jaxpr.eqns if jaxpr_tools.gemm_min_dim(e) is not None]


def test_a_plain_matmul_reports_its_smallest_of_m_k_n():
    _, (eqn,) = _eqns(lambda x, w: x @ w, (6, 40), (40, 12))
    assert jaxpr_tools.gemm_min_dim(eqn) == 6
    _, (eqn,) = _eqns(lambda x, w: x @ w, (60, 40), (40, 120))
    assert jaxpr_tools.gemm_min_dim(eqn) == 40
    # rows from several leading dimensions: [2, 30, 80] · [80, 90] has M = 60, not 30
    _, (eqn,) = _eqns(lambda x, w: x @ w, (2, 30, 80), (80, 90))
    assert jaxpr_tools.gemm_min_dim(eqn) == 60


def test_attention_einsums_report_the_head_dimension_per_batch_element():
    # batch 2, sequence 64, 4 heads of 16: M = N = 64 per (batch, head), K = 16 for the scores
    # and N = 16 for the values; the 2 × 4 batch elements do not make M larger
    q = k = v = (2, 64, 4, 16)
    _, (eqn,) = _eqns(lambda a, b: jnp.einsum("bqhd,bkhd->bhqk", a, b), q, k)
    assert jaxpr_tools.gemm_min_dim(eqn) == 16
    _, (eqn,) = _eqns(lambda p, b: jnp.einsum("bhqk,bkhd->bqhd", p, b), (2, 4, 64, 64), v)
    assert jaxpr_tools.gemm_min_dim(eqn) == 16


def test_expert_and_grouped_matmuls_report_per_expert_dimensions():
    # [E, C, D] · [E, D, F]: per expert 24 rows of 32 into 48
    _, (eqn,) = _eqns(lambda x, w: jnp.einsum("ecd,edf->ecf", x, w), (4, 24, 32), (4, 32, 48))
    assert jaxpr_tools.gemm_min_dim(eqn) == 24

    # ragged_dot: 60 rows over 4 groups (15 each on average), K 16, N 24
    def grouped(x, w):
        return jax.lax.ragged_dot(x, w, jnp.array([10, 20, 20, 10], jnp.int32))

    _, (eqn,) = _eqns(grouped, (60, 16), (4, 16, 24))
    assert jaxpr_tools.gemm_min_dim(eqn) == 15


def test_flops_by_smallest_dimension_count_scan_trips_and_sum_to_the_matmul_flops():
    def body(c, w):
        h = c @ w  # [8, 32] · [32, 32]: smallest 8, 2·8·32·32 = 16 384 FLOPs
        return h, jnp.einsum("ij,kj->ik", h, h)  # [8, 32] · [32, 8]ᵀ: smallest 8, 4 096

    def fn(x, ws, a, b):
        y, _ = jax.lax.scan(body, x, ws)  # 3 trips
        return y, a @ b  # [100, 20] · [20, 50]: smallest 20, 200 000 FLOPs

    closed, _ = _eqns(fn, (8, 32), (3, 32, 32), (100, 20), (20, 50))
    by_dim = jaxpr_tools.matmul_flops_by_min_dim(closed)
    assert by_dim == {8: 3 * (16_384 + 4_096), 20: 200_000}
    assert sum(by_dim.values()) == jaxpr_tools.matmul_flops(closed)


def test_a_tiny_llama_layer_splits_its_flops_by_hand_count():
    # 64 tokens (2 × 32) of width 64; 4 query heads and 2 KV heads of 16; MLP 128.
    # 16: the scores and the values, 2 × 2·2·4·32·32·16 = 524 288 (per batch and head: K or N 16)
    # 32: the K and V projections 64 → 32, 2 × 2·64·64·32 = 524 288
    # 64: Q and O projections 2 × 2·64·64·64 and gate, up, down 3 × 2·64·64·128 = 4 194 304
    inv = model_inventory(get_config("tiny-llama"), 2, 32)
    (g,) = inv.groups
    total = 524_288 + 524_288 + 4_194_304
    assert g.forward_flops_per_layer == total
    got = [(d, share * total) for d, share in g.matmul_min_dim_shares]
    assert [d for d, _ in got] == [16, 32, 64]
    assert [f for _, f in got] == pytest.approx([524_288, 524_288, 4_194_304], rel=1e-12)


def test_a_fused_attention_kernels_matmuls_are_not_gemms_of_the_split():
    # the matmuls under the fused-attention scope run at the kernel's rate, not as GEMMs: the
    # split leaves them out (a scan's trips still counted)
    from tierax.models.attention import FUSED_SCOPE

    def fn(x, w, q, k):
        with jax.named_scope(FUSED_SCOPE):
            s = jnp.einsum("qd,kd->qk", q, k)  # [32, 16] · [32, 16]ᵀ: smallest 16, 32 768
        return x @ w, s  # [100, 20] · [20, 50]: smallest 20, 200 000

    closed, _ = _eqns(fn, (100, 20), (20, 50), (32, 16), (32, 16))
    assert jaxpr_tools.matmul_flops_by_min_dim(closed) == {16: 32_768, 20: 200_000}
    assert jaxpr_tools.matmul_flops_by_min_dim(closed, exclude_scope=FUSED_SCOPE) == {20: 200_000}


def test_a_tiny_llama_layer_with_cudnn_attention_splits_only_its_gemms():
    # as the hand count above, the scores and values (524 288 FLOPs at 16) in cuDNN's kernel:
    # its FLOPs are the layer's fused attention FLOPs and the GEMM split is 32 and 64 only
    cfg = dataclasses.replace(get_config("tiny-llama"), attention="cudnn", dtype="bfloat16")
    (g,) = model_inventory(cfg, 2, 32).groups
    assert g.fused_attention_flops_per_layer == 524_288
    gemm = 524_288 + 4_194_304
    got = [(d, share * gemm) for d, share in g.matmul_min_dim_shares]
    assert [d for d, _ in got] == [32, 64]
    assert [f for _, f in got] == pytest.approx([524_288, 4_194_304], rel=1e-12)


def _rates(points=(), matmul=1e12) -> cm.Rates:
    return dataclasses.replace(
        cm.target_rates("cpu", "float32", calibration=CAL),
        matmul_flops_per_s=matmul,
        matmul_size_rates=tuple(points),
    )


def test_the_rate_curve_is_linear_in_log_dimension_and_clamped_at_its_ends():
    r = _rates([(40, 1e11), (80, 2e11), (320, 8e11)])
    assert r.matmul_rate_at(40 * math.sqrt(2)) == pytest.approx(1.5e11, rel=1e-12)
    assert r.matmul_rate_at(160) == pytest.approx(5e11, rel=1e-12)  # halfway from 80 to 320
    assert r.matmul_rate_at(80) == pytest.approx(2e11, rel=1e-12)
    assert r.matmul_rate_at(4) == 1e11
    assert r.matmul_rate_at(5000) == 8e11
    assert _rates().matmul_rate_at(16) == 1e12  # none measured: the matmul rate


def test_a_blend_is_the_flops_over_each_shares_seconds():
    r = _rates([(40, 1e11), (160, 4e11)])
    assert r.blended_matmul_rate(((40, 0.25), (160, 0.75))) == pytest.approx(
        1.0 / (0.25 / 1e11 + 0.75 / 4e11), rel=1e-12
    )
    assert r.blended_matmul_rate(()) == 1e12  # nothing traced: the matmul rate
    assert _rates().blended_matmul_rate(((40, 1.0),)) == 1e12  # no curve: the matmul rate


CAL = {
    "cpu": {
        "created": "hand-cal",
        "matmul_flops_per_s_float32": 1e12,
        "matmul_flops_per_s_bfloat16": 0.5e12,
        "matmul_flops_per_s": 1e12,
        "head_matmul_flops_per_s_bfloat16": 0.25e12,
        "memory_bytes_per_s": 1e11,
        "first_touch_bytes_per_s": 1e10,
        "transpose_read_elems_per_s": 2e9,
        "transpose_aliased_read_elems_per_s": 0.5e9,
        "matmul_size_rates_float32": [[40, 1e11], [160, 4e11], [640, 1e12]],
        "matmul_size_rates_bfloat16": [[40, 0.5e11], [160, 2e11], [640, 0.5e12]],
    }
}


def test_cpu_rates_read_the_curve_per_dtype_and_say_where_it_came_from():
    for dtype in ("float32", "bfloat16"):
        r = cm.target_rates("cpu", dtype, calibration=CAL)
        assert r.matmul_size_rates == tuple(
            (d, v) for d, v in CAL["cpu"][f"matmul_size_rates_{dtype}"]
        )
        assert r.sources["matmul_by_size"].startswith("measured by tierax calibrate (hand-cal)")
        assert "40, 160, 640" in r.sources["matmul_by_size"]
    old = {"cpu": {k: v for k, v in CAL["cpu"].items() if "size_rates" not in k}}
    r = cm.target_rates("cpu", "float32", calibration=old)
    assert r.matmul_size_rates == ()
    assert "not measured" in r.sources["matmul_by_size"]


# One group of 2 layers, 10 GFLOP of forward matmuls per layer, a quarter of them in GEMMs whose
# smallest dimension is 40 and the rest 160; remat recomputes 1 GFLOP unnamed and 2 GFLOP of the
# named activation per layer.  Float32 rates: 1e11 at 40 and 4e11 at 160, so the group's GEMMs run
# at 1 / (0.25 / 1e11 + 0.75 / 4e11) = 2.2857e11 FLOP/s; the LM head (2·256·64·256 FLOPs forward)
# at the mix's 1e12.
SHARES = ((40, 0.25), (160, 0.75))
LAYER_S_PER_FLOP = 0.25 / 1e11 + 0.75 / 4e11
HEAD_FLOPS = 2 * 256 * 64 * 256


def _inventory(shares=SHARES) -> Inventory:
    g = GroupInventory(
        "decoder",
        2,
        (
            Activation("decoder", N.DECODER_LAYER_INPUT, 1 * MB, 2),
            Activation("decoder", N.MLPWO, 10 * MB, 2, 2e9, 0),
        ),
        carry_bytes_per_layer=1 * MB,
        save_all_bytes_per_layer=30 * MB,
        base_recompute_flops_per_layer=1e9,
        forward_flops_per_layer=10e9,
        layer_param_count=1000,
        matmul_min_dim_shares=shares,
    )
    return Inventory(
        "hand",
        4,
        64,
        {"data": 1, "fsdp": 1},
        (g,),
        param_bytes=100 * MB,
        grad_bytes=100 * MB,
        optimizer_bytes=200 * MB,
        logits_bytes=4 * 64 * 256 * 4,
        embed_param_count=0,
    )


def _plan(mlpwo: P.Placement) -> P.Plan:
    keep = mlpwo is P.Placement.DEVICE
    rest = P.Placement.DEVICE if keep else P.Placement.REMAT
    return P.Plan(
        "hand",
        {
            "decoder": P.GroupPlan(
                {N.DECODER_LAYER_INPUT: P.Placement.DEVICE, N.MLPWO: mlpwo}, rest, (), rest
            )
        },
    )


def _simulate(placement, shares=SHARES, dtype="float32"):
    cfg = dataclasses.replace(get_config("tiny-llama"), dtype=dtype)
    rates = cm.target_rates("cpu", dtype, calibration=CAL)
    return cm.simulate(_plan(placement), for_inventory(cfg, _inventory(shares)), rates, "lhs")


def test_simulate_prices_each_groups_gemms_at_its_blend_and_the_head_at_the_mix():
    pred = _simulate(P.Placement.REMAT)
    hbm_s = pred.breakdown.hbm_s
    want_compute = 3 * 2 * 10e9 * LAYER_S_PER_FLOP + 3 * HEAD_FLOPS / 1e12
    assert pred.breakdown.compute_s - hbm_s == pytest.approx(want_compute, rel=1e-12)
    # the recomputation: 2 layers × (1 + 2) GFLOP at the blend, no traffic
    assert pred.breakdown.recompute_s == pytest.approx(6e9 * LAYER_S_PER_FLOP, rel=1e-12)
    # executed FLOPs are FLOPs whatever the rate: 3 × (20 GFLOP + the head) + 6 GFLOP recomputed
    assert pred.breakdown.executed_flops == pytest.approx(
        3 * (20e9 + HEAD_FLOPS) + 6e9, rel=1e-12
    )


def test_a_bfloat16_step_blends_its_own_curve_and_keeps_the_head_rate():
    pred = _simulate(P.Placement.DEVICE, dtype="bfloat16")
    want = 3 * 2 * 10e9 * (0.25 / 0.5e11 + 0.75 / 2e11) + 3 * HEAD_FLOPS / 0.25e12
    assert pred.breakdown.compute_s - pred.breakdown.hbm_s == pytest.approx(want, rel=1e-12)
    assert pred.breakdown.recompute_s == 0.0


def test_a_group_whose_gemms_are_large_runs_at_the_mix():
    pred = _simulate(P.Placement.REMAT, shares=((640, 1.0),))
    want = 3 * (2 * 10e9 + HEAD_FLOPS) / 1e12
    assert pred.breakdown.compute_s - pred.breakdown.hbm_s == pytest.approx(want, rel=1e-12)
    assert pred.breakdown.recompute_s == pytest.approx(6e9 / 1e12, rel=1e-12)


def test_the_planner_sees_slow_small_gemms_in_the_recompute_it_weighs():
    # the same 2 GFLOP recomputation per layer costs 1 / 2.2857e11 s per FLOP at the blend: the
    # per-activation term the planner compares with keeping or offloading
    terms = cm.item_terms(_inventory(), cm.target_rates("cpu", "float32", calibration=CAL))
    (mlpwo,) = [t for t in terms if t.name == N.MLPWO]
    assert mlpwo.recompute_s == pytest.approx(2 * 2e9 * LAYER_S_PER_FLOP, rel=1e-12)


def test_the_overlap_windows_are_the_groups_gemm_seconds_at_its_blend():
    # forward 2 layers × 10 GFLOP, backward twice that, at the blend (no traffic in this fixture):
    # the seconds host copies and collectives can hide under
    (g,) = cm.group_terms(_inventory(), cm.target_rates("cpu", "float32", calibration=CAL), "lhs")
    assert g.fwd_s == pytest.approx(2 * 10e9 * LAYER_S_PER_FLOP, rel=1e-12)
    assert g.bwd_s == pytest.approx(2 * 2 * 10e9 * LAYER_S_PER_FLOP, rel=1e-12)
    assert g.base_recompute_s == pytest.approx(2 * 1e9 * LAYER_S_PER_FLOP, rel=1e-12)


def test_calibrate_measures_the_curve_on_a_cpu_only():
    cpu = calibrate.stages(False)
    assert cpu.index("matmul float32 by size") > cpu.index("matmul bfloat16")
    assert cpu.index("matmul bfloat16 by size") < cpu.index("head matmul bfloat16")
    assert not any("by size" in s for s in calibrate.stages(True))
    for dim in harness.CPU_MATMUL_SIZE_DIMS:
        shapes = harness.cpu_matmul_size_shapes(dim)
        assert all(min(s) == dim for s in shapes)
    mix = min(min(s) for s in harness.CPU_MATMUL_SHAPES)
    assert max(harness.CPU_MATMUL_SIZE_DIMS) < mix


def test_the_calibration_table_lists_each_measured_point_but_the_mix():
    from rich.console import Console

    from tierax.report.tables import calibration_table

    entry = {
        **CAL["cpu"],
        "microbenchmarks": {
            "matmul_by_size_float32": {
                "40": {"gemms": [{"shape": [1536, 40, 2560], "role": "forward"}]}
            }
        },
    }
    console = Console(width=400, record=True)
    console.print(calibration_table(entry))
    text = console.export_text()
    rows = [line for line in text.splitlines() if "smallest dimension" in line]
    assert len(rows) == 4  # 40 and 160 of each dtype; 640 is the mix's own row
    assert "smallest dimension 40" in rows[0] and "0.100 TFLOP/s" in rows[0]
    assert "1536×40×2560 as forward" in rows[0]
    assert "smallest dimension 160" in rows[3] and "0.200 TFLOP/s" in rows[3]
