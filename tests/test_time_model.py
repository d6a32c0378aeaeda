"""The time model on a calibrated CPU, against hand computation: the calibration reaches
``simulate`` (in process and through the CLI), and each term — matmuls at the calibrated rate per
dtype, the non-matmul memory traffic, the recomputation, the first write of fresh memory — is
what the arithmetic below says, so dropping any one of them fails a test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.extend.core import jaxprs_in_params

from tierax import costmodel as cm
from tierax import names as N
from tierax import plan as P
from tierax.costmodel.first_touch import MMAP_THRESHOLD_MAX_BYTES, first_touch_s
from tierax.errors import TieraxError
from tierax.measure import harness
from tierax.models import get_config
from tierax.tracing import hbm
from tierax.tracing.inventory import Activation, GroupInventory, Inventory
from tierax.tracing.model_program import for_inventory

MB = 1_000_000
CFG = get_config("tiny-llama")  # head: d_model 64, vocab 256
MICROBATCH, SEQ = 4, 64  # 256 tokens: the LM head's forward is 2·256·64·256 = 8 388 608 FLOPs
CAL = {
    "cpu": {
        "created": "hand-cal",
        "matmul_flops_per_s_float32": 1e12,
        "matmul_flops_per_s_bfloat16": 0.5e12,
        "matmul_flops_per_s": 1e12,
        "memory_bytes_per_s": 1e11,
        "first_touch_bytes_per_s": 1e10,
        "transpose_read_elems_per_s": 2e9,
        "transpose_aliased_read_elems_per_s": 0.5e9,
    }
}


def inventory() -> Inventory:
    # One group of 2 layers: the carry 1 MB/layer and one named activation, 10 MB/layer, whose
    # recomputation costs 2 GFLOP and 4 MB of non-matmul traffic per layer; save-all residuals
    # 30 MB/layer; unnamed recomputation 1 GFLOP and 2 MB per layer; forward 10 GFLOP/layer;
    # non-matmul traffic 20 MB (forward) and 40 MB (backward) per layer.  Parameters 100 MB,
    # gradients 100 MB, AdamW moments 200 MB; the loss moves 10 MB.
    g = GroupInventory(
        "decoder",
        2,
        (
            Activation("decoder", N.DECODER_LAYER_INPUT, 1 * MB, 2),
            Activation("decoder", N.MLPWO, 10 * MB, 2, 2e9, 4 * MB),
        ),
        carry_bytes_per_layer=1 * MB,
        save_all_bytes_per_layer=30 * MB,
        base_recompute_flops_per_layer=1e9,
        forward_flops_per_layer=10e9,
        layer_param_count=1000,
        forward_hbm_bytes_per_layer=20 * MB,
        backward_hbm_bytes_per_layer=40 * MB,
        base_recompute_hbm_bytes_per_layer=2 * MB,
    )
    return Inventory(
        "hand",
        MICROBATCH,
        SEQ,
        {"data": 1, "fsdp": 1},
        (g,),
        param_bytes=100 * MB,
        grad_bytes=100 * MB,
        optimizer_bytes=200 * MB,
        logits_bytes=MICROBATCH * SEQ * 256 * 4,
        embed_param_count=0,
        loss_hbm_bytes=10 * MB,
    )


def plan(mlpwo: P.Placement) -> P.Plan:
    """mlpwo kept: save-all (every intermediate kept, unnamed ones too); recomputed: remat."""
    keep = mlpwo is P.Placement.DEVICE
    return P.Plan(
        "hand",
        {
            "decoder": P.GroupPlan(
                {N.DECODER_LAYER_INPUT: P.Placement.DEVICE, N.MLPWO: mlpwo},
                P.Placement.DEVICE if keep else P.Placement.REMAT,
                (),
                P.Placement.DEVICE if keep else P.Placement.REMAT,
            )
        },
    )


# Matmuls: 3 × (2 layers × 10 GFLOP + the head's 8 388 608) = 60.025165824 GFLOP.
MATMUL_FLOPS = 3 * (2 * 10e9 + 8_388_608)
# Non-matmul traffic no plan changes: layers 2 × (20 + 40) MB, the loss 10 MB, AdamW 7 × 100 MB
# (parameters, gradients and both moments read; parameters and moments written) = 830 MB.
HBM_BYTES = 830 * MB
# Recomputation under remat: 2 layers × (1 unnamed + 2 named) GFLOP; 2 × (2 + 4) MB of traffic.
RECOMPUTE_FLOPS, RECOMPUTE_BYTES = 6e9, 12 * MB
# Peaks (the layer-backward moment; the loss moment holds 0.59 MB of logits instead of a layer):
# save-all: 400 MB of state + 2 layers × 30 MB of residuals + one layer's 30 MB workspace = 490 MB;
# remat: 400 + the carries 2 × 1 MB + 30 = 432 MB.  Fresh memory = peak − 100 MB of parameters −
# 200 MB of moments (donated and reused): 190 MB and 132 MB.
FRESH = {"save-all": 190 * MB, "remat": 132 * MB}


def rates(dtype: str = "float32") -> cm.Rates:
    return cm.target_rates("cpu", dtype, calibration=CAL)


def expected(dtype: str, which: str) -> dict:
    mm = CAL["cpu"][f"matmul_flops_per_s_{dtype}"]
    bw, touch = CAL["cpu"]["memory_bytes_per_s"], CAL["cpu"]["first_touch_bytes_per_s"]
    out = {
        "compute_s": MATMUL_FLOPS / mm + HBM_BYTES / bw,
        "hbm_s": HBM_BYTES / bw,
        "recompute_s": 0.0,
        "recompute_hbm_s": 0.0,
        "first_touch_s": FRESH[which] / touch,
    }
    if which == "remat":
        out["recompute_s"] = RECOMPUTE_FLOPS / mm + RECOMPUTE_BYTES / bw
        out["recompute_hbm_s"] = RECOMPUTE_BYTES / bw
    out["step_time_s"] = out["compute_s"] + out["recompute_s"] + out["first_touch_s"]
    return out


def test_cpu_rates_are_the_calibration_per_dtype_and_say_so():
    for dtype in ("float32", "bfloat16"):
        r = rates(dtype)
        assert r.matmul_flops_per_s == CAL["cpu"][f"matmul_flops_per_s_{dtype}"]
        assert (r.hbm_bytes_per_s, r.first_touch_bytes_per_s) == (1e11, 1e10)
        assert r.transpose_read_elems_per_s == 2e9
        assert r.transpose_aliased_read_elems_per_s == 0.5e9
        assert r.offload_is_real is False
        for key in ("matmul", "hbm", "first_touch", "transposing_fusion"):
            assert r.sources[key].startswith("measured by tierax calibrate (hand-cal)"), key
        assert "4 KiB" in r.sources["transposing_fusion"]
    with pytest.raises(TieraxError, match="tierax calibrate"):
        cm.target_rates("cpu", "float32", calibration={})


def test_an_older_calibration_prices_aliased_rows_as_spread_ones_and_says_so():
    old = {"cpu": {k: v for k, v in CAL["cpu"].items() if "aliased" not in k}}
    r = cm.target_rates("cpu", "float32", calibration=old)
    assert r.transpose_aliased_read_elems_per_s == r.transpose_read_elems_per_s == 2e9
    assert "not measured" in r.sources["transposing_fusion"]
    assert "tierax calibrate" in r.sources["transposing_fusion"]


def test_cpu_rates_read_the_calibration_file(tmp_path, monkeypatch):
    f = tmp_path / "calibration.json"
    f.write_text(json.dumps(CAL))
    monkeypatch.setenv("TIERAX_CALIBRATION", str(f))
    assert cm.target_rates("cpu", "bfloat16") == rates("bfloat16")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("which", ["save-all", "remat"])
def test_simulate_on_a_calibrated_cpu_equals_hand_computation(dtype, which):
    cfg = dataclasses.replace(CFG, dtype=dtype)
    placement = P.Placement.DEVICE if which == "save-all" else P.Placement.REMAT
    pred = cm.simulate(plan(placement), for_inventory(cfg, inventory()), rates(dtype), "lhs")
    want = expected(dtype, which)
    for key, value in want.items():
        got = pred.step_time_s if key == "step_time_s" else getattr(pred.breakdown, key)
        assert got == pytest.approx(value, rel=1e-12, abs=1e-15), key


def test_recompute_and_memory_traffic_are_in_the_step():
    """Remat minus save-all: 6 GFLOP at 1 TFLOP/s + 12 MB at 100 GB/s, less 58 MB of fresh memory
    at 10 GB/s; twice the memory bandwidth saves half of 842 MB (830 + the 12 recomputed)."""
    inv = inventory()
    keep = cm.simulate(
        plan(P.Placement.DEVICE), for_inventory(CFG, inv), rates(), "lhs"
    ).step_time_s
    remat = cm.simulate(
        plan(P.Placement.REMAT), for_inventory(CFG, inv), rates(), "lhs"
    ).step_time_s
    assert remat - keep == pytest.approx(6e9 / 1e12 + 12 * MB / 1e11 - 58 * MB / 1e10, rel=1e-9)
    fast = dataclasses.replace(rates(), hbm_bytes_per_s=2e11)
    remat_fast = cm.simulate(
        plan(P.Placement.REMAT), for_inventory(CFG, inv), fast, "lhs"
    ).step_time_s
    assert remat - remat_fast == pytest.approx(842 * MB / 1e11 - 842 * MB / 2e11, rel=1e-9)


def test_planner_weighs_first_touch_on_a_cpu():
    """Recomputing costs 6.12 ms; keeping costs 58 MB more fresh memory: 2.9 ms at 20 GB/s (the
    planner keeps), 11.6 ms at 5 GB/s (it recomputes)."""
    from tierax.solving import planner

    inv = inventory()
    for touch, want in ((2e10, P.Placement.DEVICE), (5e9, P.Placement.REMAT)):
        r = dataclasses.replace(rates(), first_touch_bytes_per_s=touch)
        got = planner.plan(for_inventory(CFG, inv), r, schedule="lhs").plan
        # keeping = no remat at all (the unnamed intermediates kept): the docstring's 58 MB
        assert P.unnamed_placements(got, CFG)["decoder"] is want, touch


def test_first_touch_counts_temporaries_above_the_mmap_threshold():
    """Under 32 MiB of temporaries malloc recycles its heap: no page faults, no term."""
    inv = dataclasses.replace(inventory(), param_bytes=0, grad_bytes=0, optimizer_bytes=0)
    assert first_touch_s(MMAP_THRESHOLD_MAX_BYTES, inv, rates()) == 0.0
    assert first_touch_s(2 * MMAP_THRESHOLD_MAX_BYTES, inv, rates()) == 2 * 2**25 / 1e10


def test_transposed_reads_by_hand():
    """Weight gradients h^T·g of float32 operands g made elementwise in the backward (T·F elements
    each): du·a·b reads du (a dot's result), a (the residual named mlpwi_0) and b (an unnamed
    residual) and broadcasts nothing: slow only where a and b come from the stacks, 3·T·F reads
    shared between them; du·a·2 broadcasts a literal: slow always, 2·T·F; du·a·c (c a row) is
    materialised first, du·du2 (plain arrays) is fast, a bfloat16 operand is a plain copy: none
    counted; x·hx ([T, D], hx a dot's result) reads the layer's input (the carry): 2·T·D."""
    T, D, F = 8, 16, 32
    f32 = jnp.float32
    wg = (((0,), (0,)), ((), ()))  # contract the tokens of both operands

    def step(x, wa, wb, wo, c, ct):
        a = checkpoint_name(x @ wa, N.MLPWI_0)
        b = x @ wb
        ct = hbm.marker(ct)
        du, du2 = ct @ wo.T, (ct * 3.0) @ wo.T  # [T, F]
        hx = du @ wo  # [T, D]
        return (
            jax.lax.dot_general(x, du * a * b, wg),
            jax.lax.dot_general(x, du * a * 2.0, wg),
            jax.lax.dot_general(x, du * a * c[None, :], wg),
            jax.lax.dot_general(x, du * du2, wg),
            jax.lax.dot_general(x, (du * a).astype(jnp.bfloat16), wg),
            jax.lax.dot_general(du, x * hx, wg),
        )

    shapes = ((T, D), (D, F), (D, F), (F, D), (F,), (T, D))
    args = [jax.ShapeDtypeStruct(shape, f32) for shape in shapes]
    r = hbm.transposed_reads(jax.make_jaxpr(step)(*args), residual_inputs=1)
    none = {"always": 0.0, "residual": 0.0, "carry": 0.0, "named": {}}
    assert r == {
        "spread": {
            "always": 2 * T * F,
            "residual": 1.5 * T * F,
            "carry": 2 * T * D,
            "named": {N.MLPWI_0: 1.5 * T * F},
        },
        "aliased": none,
    }


def test_transposed_reads_split_by_row_stride():
    """The same slow fusion du·a·2 at F = 1024 float32 features (rows 4096 bytes apart) counts
    as aliased, at F = 1040 (4160 bytes) as spread; a [T, 8, 128] operand's rows are its 1024
    features (contracted over T), aliased."""
    T, D = 8, 16
    f32 = jnp.float32
    wg = (((0,), (0,)), ((), ()))

    def step(x, ct, w1, w2, w3):
        a = checkpoint_name(x @ w1, N.MLPWI_0)
        b = x @ w2
        c = (x @ w3).reshape(T, 8, 128)
        ct = hbm.marker(ct)
        du1, du2 = ct @ w1, ct @ w2
        du3 = (ct @ w3).reshape(T, 8, 128)
        return (
            jax.lax.dot_general(x, du1 * a * 2.0, wg),
            jax.lax.dot_general(x, du2 * b * 2.0, wg),
            jax.lax.dot_general(x, du3 * c * 2.0, wg),
        )

    shapes = ((T, D), (T, D), (D, 1024), (D, 1040), (D, 1024))
    args = [jax.ShapeDtypeStruct(shape, f32) for shape in shapes]
    r = hbm.transposed_reads(jax.make_jaxpr(step)(*args), residual_inputs=1)
    assert r["aliased"]["always"] == 2 * (2 * T * 1024)
    assert r["spread"]["always"] == 2 * T * 1040
    assert hbm.row_aliased(1024, f32) and hbm.row_aliased(3072, f32)
    assert hbm.row_aliased(2048, jnp.bfloat16) and not hbm.row_aliased(1024, jnp.bfloat16)
    assert not hbm.row_aliased(1040, f32) and not hbm.row_aliased(1280, f32)


def transposed_inventory() -> Inventory:
    # Per layer, XLA:CPU's slow transposing fusions read 4 M elements whatever the plan, 1 M as
    # an unnamed residual's share, 0.5 M as the carry's and 2 M as MLPWO's.
    inv = inventory()
    (g,) = inv.groups
    acts = tuple(
        dataclasses.replace(a, transposed_elems_per_layer=2e6 if a.name == N.MLPWO else 0.0)
        for a in g.activations
    )
    g = dataclasses.replace(
        g,
        activations=acts,
        transposed_always_elems_per_layer=4e6,
        transposed_residual_elems_per_layer=1e6,
        transposed_carry_elems_per_layer=0.5e6,
    )
    return dataclasses.replace(inv, groups=(g,))


def test_transposing_fusion_term_by_hand():
    """2 layers at 1e9 elements/s.  MLPWO recomputed: 4 M × 2 + the carry's 0.5 M × 2 = 9 ms;
    save-all: + the residual's 1 M × 2 + MLPWO's 2 M × 2 = 15 ms; one layer (no loop, no
    stacks): 4 ms whatever the plan; no rate (a GPU): 0."""
    r = dataclasses.replace(
        rates(), transpose_read_elems_per_s=1e9, transpose_aliased_read_elems_per_s=1e9
    )
    inv = transposed_inventory()
    keep = cm.simulate(plan(P.Placement.DEVICE), for_inventory(CFG, inv), r, "lhs")
    remat = cm.simulate(plan(P.Placement.REMAT), for_inventory(CFG, inv), r, "lhs")
    assert keep.breakdown.transpose_s == pytest.approx(0.015, rel=1e-12)
    assert remat.breakdown.transpose_s == pytest.approx(0.009, rel=1e-12)
    want = expected("float32", "save-all")["step_time_s"] + 0.015
    assert keep.step_time_s == pytest.approx(want)
    one = dataclasses.replace(inv, groups=(dataclasses.replace(inv.groups[0], num_layers=1),))
    for placement in (P.Placement.DEVICE, P.Placement.REMAT):
        got = cm.simulate(plan(placement), for_inventory(CFG, one), r, "lhs").breakdown.transpose_s
        assert got == pytest.approx(0.004, rel=1e-12)
    no_rate = dataclasses.replace(r, transpose_read_elems_per_s=0.0)  # a GPU: no such term
    gpu_like = cm.simulate(plan(P.Placement.DEVICE), for_inventory(CFG, inv), no_rate, "lhs")
    assert gpu_like.breakdown.transpose_s == 0


def test_aliased_reads_are_priced_at_their_own_rate():
    """The inventory of the test above with every read aliased instead, at 0.25e9 elements/s
    (spread ones at 1e9): 4 × the seconds, 60 ms and 36 ms; the same reads half spread, half
    aliased: 37.5 ms and 22.5 ms."""
    r = dataclasses.replace(
        rates(), transpose_read_elems_per_s=1e9, transpose_aliased_read_elems_per_s=0.25e9
    )
    inv = transposed_inventory()
    (g,) = inv.groups

    def moved(share: float) -> Inventory:
        """``share`` of every read count moved to the aliased class."""
        acts = tuple(
            dataclasses.replace(
                a,
                transposed_elems_per_layer=a.transposed_elems_per_layer * (1 - share),
                transposed_aliased_elems_per_layer=a.transposed_elems_per_layer * share,
            )
            for a in g.activations
        )
        fields = {}
        for kind in ("always", "residual", "carry"):
            n = getattr(g, f"transposed_{kind}_elems_per_layer")
            fields[f"transposed_{kind}_elems_per_layer"] = n * (1 - share)
            fields[f"transposed_{kind}_aliased_elems_per_layer"] = n * share
        return dataclasses.replace(
            inv, groups=(dataclasses.replace(g, activations=acts, **fields),)
        )

    for share, keep_s, remat_s in ((1.0, 0.060, 0.036), (0.5, 0.0375, 0.0225)):
        inv_s = moved(share)
        keep = cm.simulate(plan(P.Placement.DEVICE), for_inventory(CFG, inv_s), r, "lhs")
        remat = cm.simulate(plan(P.Placement.REMAT), for_inventory(CFG, inv_s), r, "lhs")
        assert keep.breakdown.transpose_s == pytest.approx(keep_s, rel=1e-12)
        assert remat.breakdown.transpose_s == pytest.approx(remat_s, rel=1e-12)


def test_planner_weighs_transposing_fusions():
    """Recomputing MLPWO costs 6.12 ms; keeping it (no remat at all) 0.58 ms of fresh memory (58
    MB at 100 GB/s) and 6 M more slow reads: 0.6 ms at 1e10 elements/s (the planner keeps it),
    6 ms at 1e9 (it recomputes)."""
    from tierax.solving import planner

    for rate, want in ((1e10, P.Placement.DEVICE), (1e9, P.Placement.REMAT)):
        r = dataclasses.replace(
            rates(), first_touch_bytes_per_s=1e11, transpose_read_elems_per_s=rate
        )
        got = planner.plan(for_inventory(CFG, transposed_inventory()), r, schedule="lhs").plan
        assert P.resolve(got, CFG)["decoder"][N.MLPWO] is want, rate


def test_microbenchmark_calls_lose_their_own_page_faults():
    """Three calls of 30, 20 and 12 ms faulting 5000, 0 and 2000 pages, at a first-touch rate of
    one page per microsecond: 25, 20 and 10 ms of work, median 20 ms (the median time less the
    median faults would say 20 − 2 = 18 ms); a rate that would cancel a call leaves a tenth of
    it; no rate: the median time."""
    page = os.sysconf("SC_PAGE_SIZE")
    times, faults = [0.030, 0.020, 0.012], [5000, 0, 2000]
    raw, touched, net = harness._less_first_touch(times, faults, page * 1e6)
    assert (raw, touched) == (0.020, 2000 * page)
    assert net == pytest.approx(0.020)
    _, _, floored = harness._less_first_touch(times, [5000, 19000, 2000], page * 1e6)
    assert floored == pytest.approx(0.010)  # 25, 2 (a tenth of 20, not 1), 10 ms
    assert harness._less_first_touch(times, faults, None)[2] == 0.020


def test_a_memory_pass_whose_fresh_calls_changed_state_is_not_settled():
    # The fresh-buffer calls of bench/results/time_fidelity_d1024_rerun.json's first calibration
    # (ms): five in a slow page-fault state, then two in the steady one; its median made the
    # first-touch rate 4.7x too slow.  The same record's closing calibration ran in one state.
    slow_start = [117.2, 118.5, 117.4, 118.1, 99.9, 36.5, 30.5]
    steady = [28.8, 27.7, 29.9, 28.8, 28.3, 29.2, 28.9]
    assert not harness.settled(slow_start)
    assert harness.settled(steady)
    # The bound is the pass's own spread: twice the fastest call still counts as one state.
    assert harness.settled([10.0, 20.0]) and not harness.settled([10.0, 20.1])
    mem = harness.stream_and_first_touch(4 << 20, repeats=3)
    assert 1 <= len(mem["passes"]) <= harness.MEMORY_PASSES
    # The rates are the last pass's; a pass is repeated only when the one before it was unsettled.
    assert mem["fresh_s"] == mem["passes"][-1]["fresh_s"]
    assert all(not harness.settled(p["fresh_s"]) for p in mem["passes"][:-1])


def test_an_unsettled_memory_pass_is_run_again_and_the_last_one_gives_the_rates(monkeypatch):
    verdicts = iter([False, True])
    monkeypatch.setattr(harness, "settled", lambda fresh_s: next(verdicts))
    mem = harness.stream_and_first_touch(4 << 20, repeats=3)
    assert len(mem["passes"]) == 2
    last = mem["passes"][1]
    assert mem["donated_s"] == last["donated_s"] and mem["fresh_s"] == last["fresh_s"]
    assert mem["memory_bytes_per_s"] == pytest.approx(
        3 * (4 << 20) / statistics.median(last["donated_s"])
    )
    monkeypatch.setattr(harness, "settled", lambda fresh_s: False)
    assert (
        len(harness.stream_and_first_touch(4 << 20, repeats=2)["passes"]) == harness.MEMORY_PASSES
    )


def test_microbenchmarks_measure_positive_rates():
    mix = harness.matmul_mix_rate("float32", shapes=((96, 32, 64),), repeats=2)
    roles = ["forward", "input-gradient", "weight-gradient"]
    assert mix["flops_per_s"] > 0 and [g["role"] for g in mix["gemms"]] == roles
    assert all(g["shape"] == [96, 32, 64] and g["flops_per_s"] > 0 for g in mix["gemms"])
    mem = harness.stream_and_first_touch(4 << 20, repeats=3)
    assert mem["memory_bytes_per_s"] > 0 and mem["first_touch_bytes_per_s"] > 0
    tr = harness.transposed_fusion_rate({"spread": (64, 96), "aliased": (64, 1024)}, repeats=2)
    assert tr["spread"]["elems_per_s"] > 0 and tr["aliased"]["elems_per_s"] > 0
    assert (tr["spread"]["row_stride_bytes"], tr["aliased"]["row_stride_bytes"]) == (384, 4096)
    assert len(tr["aliased"]["times_s"]) == 2
    small = {"tokens": 64, "width": 32, "mlp": 48, "heads": 2, "seq": 16}
    nm = harness.nonmatmul_rate(small, repeats=2)
    assert nm["bytes_per_s"] > 0 and nm["model_bytes"] > 0


def test_calibration_file_reaches_simulate_through_the_cli(tmp_path):
    """`tierax simulate --target cpu` reads TIERAX_CALIBRATION: halving the calibrated float32
    matmul rate adds the executed FLOPs once more at the first rate; the sources say measured."""

    def run(matmul: float) -> dict:
        f = tmp_path / f"cal-{matmul:g}.json"
        f.write_text(json.dumps({"cpu": CAL["cpu"] | {"matmul_flops_per_s_float32": matmul}}))
        env = dict(os.environ, TIERAX_CALIBRATION=str(f), JAX_PLATFORMS="cpu")
        # A 32000-word vocabulary: 65 MB of logits, temporaries above malloc's mmap threshold.
        cmd = [
            sys.executable,
            "-m",
            "tierax.cli",
            "simulate",
            "--model",
            "tiny-llama",
            "--set",
            "vocab_size=32000",
            "--target",
            "cpu",
            "--plan",
            "remat-full",
            "--microbatch",
            "4",
            "--seq",
            "128",
            "--json",
        ]
        r = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)

    a, b = run(1e12), run(0.5e12)
    assert a["breakdown"]["rates"]["matmul"].startswith("measured by tierax calibrate (hand-cal)")
    flops = a["breakdown"]["executed_flops"]
    assert b["step_time_s"] - a["step_time_s"] == pytest.approx(flops / 1e12, rel=1e-9)
    assert a["breakdown"]["first_touch_s"] > 0 and a["breakdown"]["hbm_s"] > 0


# The LM head of the hand inventory: 2 · 256 tokens · d_model 64 · vocab 256 FLOPs forward.
HEAD_FLOPS = 2 * MICROBATCH * SEQ * CFG.d_model * CFG.vocab_size


@pytest.mark.parametrize("which", ["save-all", "remat"])
def test_a_bfloat16_lm_head_is_priced_at_the_calibrated_head_rate(which):
    """The head's three GEMMs (3 × 8 388 608 FLOPs) move from the bfloat16 mix's 0.5 TFLOP/s to a
    head rate of 0.125 TFLOP/s; every other term is unchanged; a float32 step never reads the
    key."""
    assert HEAD_FLOPS == 8_388_608
    cal = {"cpu": CAL["cpu"] | {"head_matmul_flops_per_s_bfloat16": 0.125e12}}
    placement = P.Placement.DEVICE if which == "save-all" else P.Placement.REMAT
    bf16 = cm.target_rates("cpu", "bfloat16", calibration=cal)
    assert bf16.head_matmul_flops_per_s == 0.125e12
    assert bf16.sources["head_matmul"].startswith("measured by tierax calibrate (hand-cal)")
    cfg = dataclasses.replace(CFG, dtype="bfloat16")
    pred = cm.simulate(plan(placement), for_inventory(cfg, inventory()), bf16, "lhs")
    want = expected("bfloat16", which)
    head_s = 3 * HEAD_FLOPS / 0.125e12
    assert pred.breakdown.compute_s == pytest.approx(
        (MATMUL_FLOPS - 3 * HEAD_FLOPS) / 0.5e12 + head_s + HBM_BYTES / 1e11, rel=1e-12
    )
    assert pred.step_time_s - want["step_time_s"] == pytest.approx(
        head_s - 3 * HEAD_FLOPS / 0.5e12, rel=1e-9
    )
    for key in ("recompute_s", "first_touch_s", "hbm_s"):
        assert getattr(pred.breakdown, key) == pytest.approx(want[key], rel=1e-12), key
    f32 = cm.target_rates("cpu", "float32", calibration=cal)
    assert f32.head_matmul_flops_per_s == 0.0 and "mix's rate" in f32.sources["head_matmul"]
    got = cm.simulate(plan(placement), for_inventory(CFG, inventory()), f32, "lhs").step_time_s
    assert got == pytest.approx(expected("float32", which)["step_time_s"], rel=1e-12)
    # An older file without the key: the mix's rate, and the source says to calibrate again.
    old = cm.target_rates("cpu", "bfloat16", calibration=CAL)
    assert old.head_matmul_flops_per_s == 0.0 and "tierax calibrate" in old.sources["head_matmul"]


def test_a_tiled_loss_recomputes_its_head_at_the_head_rate():
    """loss_tiles > 1 adds one more forward of the head: 4 × its FLOPs at the head rate."""
    cal = {"cpu": CAL["cpu"] | {"head_matmul_flops_per_s_bfloat16": 0.125e12}}
    bf16 = cm.target_rates("cpu", "bfloat16", calibration=cal)
    mix = cm.target_rates("cpu", "bfloat16", calibration=CAL)
    cfg = dataclasses.replace(CFG, dtype="bfloat16", loss_tiles=2)
    inv = inventory()
    got = (
        cm.fixed_terms(for_inventory(cfg, inv), bf16, "lhs").compute_s
        - cm.fixed_terms(for_inventory(cfg, inv), mix, "lhs").compute_s
    )
    assert got == pytest.approx(4 * HEAD_FLOPS * (1 / 0.125e12 - 1 / 0.5e12), rel=1e-9)


def _head_dots(closed_jaxpr, vocab: int) -> list:
    """Every dot_general of a jaxpr (sub-jaxprs included) with an operand or output dimension of
    the vocabulary's size."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                shapes = [v.aval.shape for v in (*eqn.invars, *eqn.outvars)]
                if any(vocab in s for s in shapes):
                    found.append(eqn)
            for sub in jaxprs_in_params(eqn.params):
                walk(sub)

    walk(closed_jaxpr.jaxpr)
    return found


def _dtypes(eqn) -> tuple[str, str, str]:
    return tuple(jnp.dtype(v.aval.dtype).name for v in (*eqn.invars, *eqn.outvars))


def test_the_head_gemms_are_timed_in_the_form_the_bfloat16_step_runs_them():
    """The step's LM-head GEMMs (traced from tierax's bfloat16 train step) are bfloat16 operands
    with float32 products, as harness.HEAD_MATMUL_ROLES writes them, and its layer GEMMs bfloat16
    products, as MATMUL_ROLES writes them; XLA:CPU converts the latter's operands to float32 and
    runs the former on bfloat16 operands (the compiled HLO), so they are two kernels."""
    from flax import nnx

    from tierax import plan as plan_lib
    from tierax.models import abstract_model
    from tierax.train import step as step_lib

    cfg = dataclasses.replace(CFG, dtype="bfloat16", vocab_size=320)
    # the step's jaxpr (what is asserted) from its parameters' and tokens' shapes and dtypes
    graphdef, params = nnx.split(abstract_model(cfg))
    tokens = jax.ShapeDtypeStruct((8, 33), jnp.int32)  # synthetic_batch(cfg, 8, 32)'s
    pl = plan_lib.preset("save-all", cfg)
    loss_fn = step_lib.make_loss_fn(graphdef, plan_lib.to_policies(pl, cfg), None)
    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss_fn))(params, tokens)
    head = _head_dots(jaxpr, 320)
    assert len(head) == 3  # forward, input gradient, weight gradient
    assert {_dtypes(e) for e in head} == {("bfloat16", "bfloat16", "float32")}
    m, k, n = 96, 32, 320
    for role, gemm in harness.HEAD_MATMUL_ROLES.items():
        a_shape, b_shape, fn = gemm(m, k, n, "bfloat16")
        a, b = jnp.ones(a_shape, jnp.bfloat16), jnp.ones(b_shape, jnp.bfloat16)
        (eqn,) = _head_dots(jax.make_jaxpr(fn)(a, b), n)
        assert _dtypes(eqn) == ("bfloat16", "bfloat16", "float32"), role
        # forward and input gradient: a GEMM of the bfloat16 operands, nothing converted; the
        # weight gradient: float32 copies of both operands, its float32 product not converted back
        want = ["f32", "f32", "f32"] if role == "weight-gradient" else ["f32"]
        assert _entry_ops(fn, a, b) == ["bf16", "bf16", *want], role
    for role, gemm in harness.MATMUL_ROLES.items():
        a_shape, b_shape, fn = gemm(m, k, n, "bfloat16")
        a, b = jnp.ones(a_shape, jnp.bfloat16), jnp.ones(b_shape, jnp.bfloat16)
        (eqn,) = _head_dots(jax.make_jaxpr(fn)(a, b), n)
        assert _dtypes(eqn)[2] == "bfloat16", role
        # jax 0.10/0.11's XLA:CPU: both operands converted to float32, the float32 product
        # converted back to bfloat16.  jax 0.12's runs the forward and the input gradient on the
        # bfloat16 operands themselves (a bfloat16 GEMM; the weight gradient as before): the
        # calibration times the same functions, so it times whichever form the step compiles to.
        converted = ["bf16", "bf16", "f32", "f32", "f32", "bf16"]
        native = role != "weight-gradient" and _JAX >= (0, 12)
        assert _entry_ops(fn, a, b) == (["bf16", "bf16", "bf16"] if native else converted), role


_JAX = tuple(int(p) for p in jax.__version__.split(".")[:2])


def _entry_ops(fn, *args) -> list[str]:
    """The element types of the compiled entry computation's instructions, in order."""
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    entry = hlo[hlo.index("ENTRY") :].splitlines()[1:]
    return [line.split("=")[1].split("[")[0].strip() for line in entry if " = " in line]


def test_the_head_matmul_microbenchmark_times_three_float32_product_gemms():
    r = harness.matmul_mix_rate(
        "bfloat16", shapes=((96, 32, 320),), repeats=2, roles=harness.HEAD_MATMUL_ROLES
    )
    assert [g["role"] for g in r["gemms"]] == ["forward", "input-gradient", "weight-gradient"]
    secs = sum(2 * 96 * 32 * 320 / g["flops_per_s"] for g in r["gemms"])
    assert r["flops_per_s"] == pytest.approx(3 * 2 * 96 * 32 * 320 / secs, rel=1e-9)
    assert harness.CPU_HEAD_MATMUL_SHAPES == (harness.CPU_MATMUL_SHAPES[1],)
