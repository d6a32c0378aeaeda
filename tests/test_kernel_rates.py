"""The sourced GPU kernel rates (tierax.hardware.kernel_rates) against the published figures by
hand: GEMMs by dtype and smallest dimension (an interpolation between two published shapes
computed here), the sustained-power factor, cuDNN attention by sequence length and head dim, the
sources each rates line names, and the interference of overlapped communication on a toy step:
its predicted step changes by exactly the slowdown times the hidden collective seconds where a
collective hides under compute, and not at all where none does."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from tierax import costmodel as cm
from tierax import names as N
from tierax import plan as plan_lib
from tierax.models import get_config
from tierax.tracing.inventory import Activation, GroupInventory, Inventory
from tierax.tracing.model_program import for_inventory
from tierax.tracing.program import FusedAttention

T = 1e12
# Sustained power by hand: Hopper from the A100 pair (257 sustained over the sweep's 271.2), four
# (eight) GPUs at once 6 % lower; Blackwell from GB200's GEMMs inside a rack's training step
# (1.4–1.7 PF/s, every GPU at once already, over the sweep's 1822).
HOPPER = 257 / 271.2 * 0.94
BLACKWELL = 1550 / 1822.0
# XLA's bf16 tables, 4096 × 4096 × d (TFLOP/s), the shares' reference 4096³: sm_90 (Hopper) and
# sm_100 (Blackwell).
XLA = {1024: 677.439636593059, 2048: 738.736406437117, 4096: 783.328793548203}
XLA_SM100 = {512: 805.318951108611, 1024: 1075.624166291009, 4096: 1416.867213789406}


@pytest.mark.parametrize(
    ("target", "bf16", "fp8", "factor"),
    [
        ("h100", 794.5, 1402.6, HOPPER),
        ("h200", 794.5, 1453.4, HOPPER),
        ("b200", 1745.0, 3432.5, BLACKWELL),
        ("gb200", 1822.0, 3615.6, BLACKWELL),
    ],
)
def test_gemm_rates_are_the_published_sweeps_at_sustained_power(target, bf16, fp8, factor):
    r = cm.target_rates(target, "bfloat16", calibration={})
    assert r.matmul_flops_per_s == pytest.approx(bf16 * T * factor, rel=1e-12)
    assert r.fp8_matmul_flops_per_s == pytest.approx(fp8 * T * factor, rel=1e-12)
    # large GEMMs (smallest dimension 4096 and up) at the sweep's best-shape rate
    assert r.matmul_rate_at(4096) == pytest.approx(bf16 * T * factor, rel=1e-12)
    assert r.matmul_rate_at(16384) == pytest.approx(bf16 * T * factor, rel=1e-12)


def test_gemm_rate_between_two_published_shapes_by_hand():
    r = cm.target_rates("h100", "bfloat16", calibration={})
    d = 1448  # between XLA's 1024 and 2048 points: linear in log d
    t = math.log(d / 1024) / math.log(2)
    share = (XLA[1024] + t * (XLA[2048] - XLA[1024])) / XLA[4096]
    assert r.matmul_rate_at(d) == pytest.approx(794.5 * T * HOPPER * share, rel=1e-12)
    assert r.matmul_rate_at(2048) == pytest.approx(794.5 * T * HOPPER * XLA[2048] / XLA[4096])
    # fp8 GEMMs take the same share of the fp8 sweep's rate (blended over the group's GEMMs)
    shares = ((1024, 0.25), (8192, 0.75))
    blended = 1 / (0.25 / (XLA[1024] / XLA[4096]) + 0.75 / 1.0)
    assert r.blended_fp8_rate(shares) == pytest.approx(1402.6 * T * HOPPER * blended, rel=1e-12)


@pytest.mark.parametrize(("target", "bf16"), [("b200", 1745.0), ("gb200", 1822.0)])
def test_blackwell_gemms_take_xlas_sm100_shares_by_hand(target, bf16):
    r = cm.target_rates(target, "bfloat16", calibration={})
    for d in (512, 1024):
        share = XLA_SM100[d] / XLA_SM100[4096]
        assert r.matmul_rate_at(d) == pytest.approx(bf16 * T * BLACKWELL * share, rel=1e-12)
    d = 724  # between 512 and 1024: linear in log d
    t = math.log(d / 512) / math.log(2)
    share = (XLA_SM100[512] + t * (XLA_SM100[1024] - XLA_SM100[512])) / XLA_SM100[4096]
    assert r.matmul_rate_at(d) == pytest.approx(bf16 * T * BLACKWELL * share, rel=1e-12)
    assert "sm_100 bf16 4096×4096×d: d=256 .36, 512 .57, 1024 .76" in r.sources["matmul_by_size"]
    # Hopper keeps sm_90's
    h100 = cm.target_rates("h100", "bfloat16", calibration={})
    assert "sm_90 bf16 4096×4096×d: d=256 .50, 512 .69, 1024 .86" in h100.sources["matmul_by_size"]


def test_targets_without_a_published_sweep_keep_the_datasheet_rule():
    gb300 = cm.target_rates("gb300", "bfloat16", calibration={})
    assert gb300.matmul_flops_per_s == pytest.approx(2.5e15 * cm.ACHIEVABLE_FRACTION)
    assert gb300.matmul_size_rates == ()
    assert "no published bfloat16 sweep for gb300" in gb300.sources["matmul"]
    f32 = cm.target_rates("h100", "float32", calibration={})
    assert f32.matmul_flops_per_s == pytest.approx(494e12 * cm.ACHIEVABLE_FRACTION)
    # TPU targets take the rates measured on a TPU chip (tests/test_tpu_kernel_rates.py), not
    # the GPU rule, and no GPU interference term
    v6e = cm.target_rates("v6e", "bfloat16", calibration={})
    assert v6e.matmul_flops_per_s != pytest.approx(918e12 * cm.ACHIEVABLE_FRACTION)
    assert "no v6e chip measured" in v6e.sources["matmul"]
    assert v6e.overlap_slowdown == 0.0 and "interference" not in v6e.sources


def _prog(seq: int, head_dim: int) -> SimpleNamespace:
    return SimpleNamespace(seq=seq, attention=FusedAttention("cudnn", 8, head_dim))


def test_cudnn_attention_by_sequence_and_head_dim_by_hand():
    r = cm.target_rates("h100", "bfloat16", calibration={})
    at8k = cm.for_program(r, _prog(8192, 128))  # the published points: 529 forward, 518 backward
    assert at8k.fused_attention_fwd_flops_per_s == pytest.approx(529 * T * HOPPER, rel=1e-12)
    assert at8k.fused_attention_bwd_flops_per_s == pytest.approx(518 * T * HOPPER, rel=1e-12)
    assert cm.for_program(at8k, _prog(512, 64)) is at8k  # resolved once: idempotent
    seq = 6000  # between 4k (518, 499) and 8k, linear in log sequence
    t = math.log(seq / 4096) / math.log(2)
    mid = cm.for_program(r, _prog(seq, 128))
    assert mid.fused_attention_fwd_flops_per_s == pytest.approx(
        (518 + t * (529 - 518)) * T * HOPPER, rel=1e-12
    )
    # head dim 96: half way between the 64 (379, 432 at 8k) and 128 figures
    hd96 = cm.for_program(r, _prog(8192, 96))
    assert hd96.fused_attention_fwd_flops_per_s == pytest.approx((379 + 529) / 2 * T * HOPPER)
    assert hd96.fused_attention_bwd_flops_per_s == pytest.approx((432 + 518) / 2 * T * HOPPER)
    # B200: the H100's shares of its own 2250 TFLOP/s peak, at Blackwell's sustained factor
    b200 = cm.for_program(cm.target_rates("b200", "bfloat16", calibration={}), _prog(8192, 128))
    assert b200.fused_attention_fwd_flops_per_s == pytest.approx(
        529 / 989 * 2250 * T * BLACKWELL, rel=1e-12
    )
    # a given --rate is taken as is, whatever the program's shape
    given = cm.override_rates(r, ["fused_attention_fwd=600"])
    assert cm.for_program(given, _prog(512, 64)).fused_attention_fwd_flops_per_s == 600 * T


def test_matmul_override_keeps_the_rates_by_size_shape():
    r = cm.override_rates(cm.target_rates("h100", "bfloat16", calibration={}), ["matmul=500"])
    assert r.matmul_rate_at(8192) == pytest.approx(500 * T)
    assert r.matmul_rate_at(2048) == pytest.approx(500 * T * XLA[2048] / XLA[4096])


def test_the_rates_line_names_each_source():
    h100 = cm.target_rates("h100", "bfloat16", calibration={}).sources
    assert "794.5 TFLOP/s at 2048x2048x13312" in h100["matmul"]
    assert "ml-engineering" in h100["matmul"] and "thonking.ai" in h100["matmul"]
    assert "1402.6 TFLOP/s fp8" in h100["fp8_matmul"]
    assert "XLA's default GPU matmul table" in h100["matmul_by_size"]
    assert "2407.08608" in h100["fused_attention"]
    assert "2507.03114" in h100["interference"]
    gb200 = cm.target_rates("gb200", "bfloat16", calibration={}).sources
    assert "1822.0 TFLOP/s at 4096x9728x2048" in gb200["matmul"]
    assert "marin mfu30 logbook" in gb200["matmul"]
    assert "3615.6 TFLOP/s fp8" in gb200["fp8_matmul"]


# A GEMM-heavy toy step (tiny-deepseek: float32 parameters and compute, so gathered bytes are the
# stored bytes): 4 layers of 1 TFLOP forward each, 40 MB of parameters per device.
CFG = get_config("tiny-deepseek")
LAYER_FLOPS = 1e12
PARAM_BYTES = 40e6


def _toy(mesh: dict) -> Inventory:
    g = GroupInventory(
        "dense",
        4,
        (
            Activation("dense", N.DECODER_LAYER_INPUT, 1000, 4, 0.0),
            Activation("dense", N.MLPWI_0, 1000, 4, 0.0),
        ),
        carry_bytes_per_layer=1000,
        save_all_bytes_per_layer=2000,
        base_recompute_flops_per_layer=0.0,
        forward_flops_per_layer=LAYER_FLOPS,
        layer_param_count=1000,
    )
    return Inventory(
        "toy",
        1,
        8,
        {"data": 1, "fsdp": 1, **mesh},
        (g,),
        param_bytes=int(PARAM_BYTES),
        grad_bytes=int(PARAM_BYTES),
        optimizer_bytes=0,
        logits_bytes=0,
        embed_param_count=0,
    )


def _step(inv: Inventory, rates, schedule: str = "lhs") -> cm.Prediction:
    P = plan_lib.Placement
    placements = {("dense", N.MLPWI_0): P.DEVICE, ("dense", plan_lib.UNNAMED): P.REMAT}
    return cm.evaluate(placements, for_inventory(CFG, inv), rates, schedule)


def test_toy_step_gemm_time_is_the_sweep_rate_at_sustained_power():
    inv = _toy({"fsdp": 8})
    head = 2 * 8 * CFG.d_model * CFG.vocab_size  # the LM head's forward FLOPs, 8 tokens
    flops = 3 * (4 * LAYER_FLOPS + head)
    # bf16 rates (the toy's GEMMs have no sizes: the large GEMMs' rate): H100's sweep, sustained
    pred = _step(inv, cm.target_rates("h100", "bfloat16", calibration={}))
    assert pred.split.gemm_s == pytest.approx(flops / (794.5e12 * HOPPER), rel=1e-9)
    # float32: no sweep, the datasheet rule (tf32 494 × 0.8) and no sustained factor
    pred = _step(inv, cm.target_rates("h100", "float32", calibration={}))
    assert pred.split.gemm_s == pytest.approx(flops / (494e12 * 0.8), rel=1e-9)


def test_interference_changes_the_step_by_exactly_the_slowdown_of_the_hidden_collectives():
    rates = cm.target_rates("h100", "bfloat16", calibration={})
    off = dataclasses.replace(rates, overlap_slowdown=0.0)
    inv = _toy({"fsdp": 8})
    # FSDP gathers twice and reduce-scatters once, 7/8 of the 8 × 40 MB gathered, over NVLink's
    # 450 GB/s per direction (one domain of 8): all hidden under the 17 ms of GEMMs
    coll = 3 * PARAM_BYTES * 8 * 7 / 8 / 450e9
    on_step, off_step = _step(inv, rates), _step(inv, off)
    assert off_step.breakdown.collective_s == pytest.approx(coll)
    assert off_step.breakdown.exposed_collective_s == 0.0
    assert on_step.step_time_s - off_step.step_time_s == pytest.approx(0.189 * coll, rel=1e-9)
    assert on_step.breakdown.interference_s == pytest.approx(0.189 * coll, rel=1e-9)
    assert on_step.split.total_s == pytest.approx(on_step.step_time_s)
    # where nothing hides under compute it does not apply: the serial schedule, one device
    assert _step(inv, rates, "serial").step_time_s == _step(inv, off, "serial").step_time_s
    one = _toy({})
    assert _step(one, rates).step_time_s == _step(one, off).step_time_s
