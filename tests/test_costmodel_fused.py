"""The cost model's fused-attention terms (attention=cudnn) against hand computation."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

from tierax import costmodel as cm
from tierax import hardware
from tierax import names as N
from tierax import plan as P
from tierax.costmodel.rates import matmul_s
from tierax.errors import TieraxError
from tierax.hardware import cudnn
from tierax.models import get_config
from tierax.tracing.inventory import Activation, GroupInventory, Inventory, model_inventory
from tierax.tracing.model_program import for_inventory

KERNEL_RATES = json.loads(
    (
        pathlib.Path(__file__).resolve().parents[1] / "bench/results/tpu_kernel_rates.json"
    ).read_text()
)["rates"]

# Round rates: matmuls at 1 PFLOP/s, the fused kernel's forward at 0.5 and backward at 0.25 PFLOP/s.
RATES = cm.Rates(
    "hand",
    matmul_flops_per_s=1e15,
    hbm_bytes_per_s=1e12,
    d2h_bytes_per_s=10e9,
    h2d_bytes_per_s=10e9,
    interconnect_bytes_per_s=450e9,
    device_memory_bytes=10**12,
    host_memory_bytes=10**12,
    offload_is_real=True,
    fused_attention_fwd_flops_per_s=0.5e15,
    fused_attention_bwd_flops_per_s=0.25e15,
)


def test_matmul_seconds_split_the_fused_kernel_out():
    # 10 TFLOP forward, 4 of them in the kernel: 6/1000 + 4/500 = 0.014 s.
    assert matmul_s(10e12, 4e12, RATES) == pytest.approx(0.006 + 0.008)
    # Backward: the rest twice at the matmul rate, the kernel 2.5 × at its backward rate: 0.012 +
    # 0.04.
    assert matmul_s(10e12, 4e12, RATES, backward=True) == pytest.approx(0.012 + 0.04)
    # No fused FLOPs: the old terms exactly.
    assert matmul_s(10e12, 0.0, RATES, backward=True) == 2 * 10e12 / 1e15


def test_a_tpu_target_prices_splash_at_its_measured_rate_and_a_target_without_one_refuses():
    tpu = cm.target_rates("v5p", "bfloat16", calibration={})
    # The splash kernel measured on a v5e chip at the reference shape (seq 4096, head dim 128), as
    # its shares of v5e's 197 TFLOP/s, of v5p's 459 (tests/test_tpu_kernel_rates.py pins them to
    # the record); slower than the dense matmuls, and stated in the source.
    splash = {(c["seq"], c["head_dim"]): c for c in KERNEL_RATES["splash"]}[(4096, 128)]
    fwd, bwd = splash["fwd_efficiency"] * 459e12, splash["bwd_efficiency"] * 459e12
    assert tpu.fused_attention_fwd_flops_per_s == pytest.approx(fwd, rel=1e-12)
    assert tpu.fused_attention_bwd_flops_per_s == pytest.approx(bwd, rel=1e-12)
    assert tpu.fused_attention_fwd_flops_per_s < tpu.matmul_flops_per_s / 2
    assert "splash" in tpu.sources["fused_attention"]
    assert "bench/results/tpu_kernel_rates.json" in tpu.sources["fused_attention"]
    # 1 TFLOP, all in the kernel: forward 1e12/fwd s, backward 2.5 × 1e12/bwd.
    assert matmul_s(1e12, 1e12, tpu) == pytest.approx(1e12 / fwd)
    assert matmul_s(1e12, 1e12, tpu, backward=True) == pytest.approx(2.5e12 / bwd)
    none = dataclasses.replace(
        tpu, fused_attention_fwd_flops_per_s=0.0, fused_attention_bwd_flops_per_s=0.0
    )
    with pytest.raises(TieraxError, match="CUDA GPUs only and attention=splash on TPUs"):
        matmul_s(1e12, 1e12, none)


def test_gpu_rates_are_the_published_shares_of_each_peak():
    # at the reference shape (sequence 4k, head dim 128): cuDNN's causal forward 518 and backward
    # 499 TFLOP/s of the H100's 989, at each architecture's sustained-power factor (by hand:
    # Hopper 257/271.2 × 0.94, Blackwell 1550/1822; tests/test_kernel_rates.py)
    for key, sustained in (
        ("h100", 257 / 271.2 * 0.94),
        ("h200", 257 / 271.2 * 0.94),
        ("gb200", 1550 / 1822),
    ):
        r = cm.target_rates(key, "bfloat16", calibration={})
        peak = hardware.get_target(key).peak("bfloat16")
        assert r.fused_attention_fwd_flops_per_s == pytest.approx(peak * 518 / 989 * sustained)
        assert r.fused_attention_bwd_flops_per_s == pytest.approx(peak * 499 / 989 * sustained)
        assert "arXiv:2407.08608" in r.sources["fused_attention"]


def _inventory(fused: float) -> Inventory:
    # One group of 2 layers: forward 10 TFLOP/layer of which `fused` in the kernel; base recompute
    # 3 TFLOP/layer of which 1 in the kernel; one named activation recomputed at 2 TFLOP/layer (0.5
    # fused).
    g = GroupInventory(
        "decoder",
        2,
        (
            Activation("decoder", N.DECODER_LAYER_INPUT, 1000, 2, 0.0),
            Activation("decoder", N.ATTENTION_OUT, 1000, 2, 2e12, 0.0, 0.5e12 if fused else 0.0),
        ),
        carry_bytes_per_layer=1000,
        save_all_bytes_per_layer=10_000,
        base_recompute_flops_per_layer=3e12,
        forward_flops_per_layer=10e12,
        layer_param_count=10,
        fused_attention_flops_per_layer=fused,
        base_recompute_fused_flops_per_layer=1e12 if fused else 0.0,
    )
    return Inventory(
        "hand",
        1,
        128,
        {"data": 1, "fsdp": 1},
        (g,),
        param_bytes=0,
        grad_bytes=0,
        optimizer_bytes=0,
        logits_bytes=0,
        embed_param_count=0,
    )


def test_group_and_item_terms_price_the_kernel_at_its_rates():
    inv = _inventory(4e12)
    (g,) = cm.group_terms(inv, RATES, "lhs")
    assert g.fwd_s == pytest.approx(2 * (0.006 + 0.008))
    assert g.bwd_s == pytest.approx(2 * (0.012 + 0.04))
    # Base recompute: 2 TFLOP at 1 PFLOP/s + 1 TFLOP at 0.5 PFLOP/s, per layer.
    assert g.base_recompute_s == pytest.approx(2 * (0.002 + 0.002))
    (item,) = cm.item_terms(inv, RATES)
    assert item.recompute_s == pytest.approx(2 * (1.5e12 / 1e15 + 0.5e12 / 0.5e15))


def test_fixed_compute_counts_the_kernel_forward_and_backward():
    inv = _inventory(4e12)
    model = dataclasses.replace(get_config("tiny-llama"), dtype="bfloat16")
    fx = cm.fixed_terms(for_inventory(model, inv), RATES, "lhs")
    head = 2.0 * 128 * model.d_model * model.vocab_size
    # Rest of the matmuls three times (forward + 2 × backward) at 1 PFLOP/s; the kernel's forward at
    # 0.5 and its 2.5 × backward at 0.25 PFLOP/s; 2 layers each.
    expected = (3 * (2 * 6e12 + head)) / 1e15 + 2 * 4e12 / 0.5e15 + 2 * 2.5 * 4e12 / 0.25e15
    assert fx.compute_s - fx.hbm_s == pytest.approx(expected)
    assert fx.fused_attention_s == pytest.approx(2 * 4e12 / 0.5e15 + 2 * 2.5 * 4e12 / 0.25e15)
    assert fx.executed_flops == pytest.approx(3 * (2 * 10e12 + head) + 0.5 * 2 * 4e12)


def test_cudnn_workspace_joins_the_layer_in_flight():
    cfg = dataclasses.replace(get_config("tiny-llama"), dtype="bfloat16", attention="cudnn")
    rates = cm.target_rates("h200", "bfloat16")
    inv = model_inventory(cfg, 2, 64)
    fused = cm.fixed_terms(for_inventory(cfg, inv), rates, "lhs").workspace_bytes
    standin = cm.fixed_terms(
        for_inventory(dataclasses.replace(cfg, attention="cudnn_blockwise"), inv), rates, "lhs"
    ).workspace_bytes
    _, dqk, _ = cfg.attention_dims()
    expected = 4 * 2 * cfg.num_heads * 64 * (dqk + 1) + 256
    assert fused - standin == cudnn.backward_workspace_bytes(2, cfg.num_heads, 64, dqk) == expected


def test_fused_attention_takes_score_traffic_off_hbm():
    # The same step with blockwise attention and with cuDNN's kernel: the kernel's FLOPs move to its
    # own term and the blockwise form's score-block traffic leaves the HBM term.
    base = dataclasses.replace(
        get_config("tiny-llama"), dtype="bfloat16", attention="blockwise", attention_block=16
    )
    fused = dataclasses.replace(base, attention="cudnn")
    rates = cm.target_rates("h200", "bfloat16")
    plan = P.preset("remat-full", base)
    a = cm.simulate(
        plan, for_inventory(base, model_inventory(base, 2, 128)), rates, "lhs"
    ).breakdown
    b = cm.simulate(
        plan, for_inventory(fused, model_inventory(fused, 2, 128)), rates, "lhs"
    ).breakdown
    assert a.fused_attention_s == 0 < b.fused_attention_s
    assert b.hbm_s < a.hbm_s
