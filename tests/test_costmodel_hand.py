"""The cost model against hand computation: bytes from shapes, seconds from bytes / link rate and
FLOPs / rate.

Every expected number below is written out as arithmetic on round inputs, not computed with tierax,
so a time or memory term that is dropped, doubled or swapped (d2h vs h2d, window vs transfer)
changes a result.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from tierax import costmodel as cm
from tierax import names as N
from tierax import plan as P
from tierax.models import get_config
from tierax.tracing.inventory import Activation, GroupInventory, Inventory, model_inventory
from tierax.tracing.model_program import for_inventory

CFG = get_config("tiny-deepseek")  # head shape: d_model 64, vocab 256
MICROBATCH, SEQ = 4, 64  # 256 tokens: LM head forward = 2·256·64·256 = 8 388 608 FLOPs
RATES = cm.Rates(
    "hand",
    matmul_flops_per_s=1e12,
    hbm_bytes_per_s=4e12,
    d2h_bytes_per_s=10e9,
    h2d_bytes_per_s=5e9,
    interconnect_bytes_per_s=450e9,
    device_memory_bytes=10**12,
    host_memory_bytes=10**12,
    offload_is_real=True,
)


def inventory() -> Inventory:
    # dense: 2 layers; query_proj 40 MB/layer (recompute 2 GFLOP/layer), mlpwo 2 MB/layer (1
    # GFLOP/layer);
    #        carry 1 MB/layer; save-all residuals 50 MB/layer; unnamed recompute 0.5 GFLOP/layer;
    #        forward 1 GFLOP/layer; non-matmul HBM traffic: forward 4 MB/layer, backward 8 MB/layer,
    #        unnamed recompute 2 MB/layer, mlpwo's recompute 2 MB/layer (query_proj's 6 MB/layer: it
    #        is offloaded, never recomputed).
    # moe:   3 layers; moe_mlpwi_0 10 MB/layer (3 GFLOP/layer), key_proj 4 MB/layer (0.2
    # GFLOP/layer);
    #        carry 1 MB/layer; save-all 20 MB/layer; unnamed recompute 0; forward 4 GFLOP/layer.
    dense = GroupInventory(
        "dense",
        2,
        (
            Activation("dense", N.DECODER_LAYER_INPUT, 1_000_000, 2, 0.0),
            Activation("dense", N.QUERY_PROJ, 40_000_000, 2, 2e9, 6_000_000),
            Activation("dense", N.MLPWO, 2_000_000, 2, 1e9, 2_000_000),
        ),
        carry_bytes_per_layer=1_000_000,
        save_all_bytes_per_layer=50_000_000,
        base_recompute_flops_per_layer=0.5e9,
        forward_flops_per_layer=1e9,
        layer_param_count=1000,
        forward_hbm_bytes_per_layer=4_000_000,
        backward_hbm_bytes_per_layer=8_000_000,
        base_recompute_hbm_bytes_per_layer=2_000_000,
    )
    moe = GroupInventory(
        "moe",
        3,
        (
            Activation("moe", N.DECODER_LAYER_INPUT, 1_000_000, 3, 0.0),
            Activation("moe", N.MOE_MLPWI_0, 10_000_000, 3, 3e9),
            Activation("moe", N.KEY_PROJ, 4_000_000, 3, 0.2e9),
        ),
        carry_bytes_per_layer=1_000_000,
        save_all_bytes_per_layer=20_000_000,
        base_recompute_flops_per_layer=0.0,
        forward_flops_per_layer=4e9,
        layer_param_count=1000,
    )
    return Inventory(
        "hand",
        MICROBATCH,
        SEQ,
        {"data": 1, "fsdp": 1},
        (dense, moe),
        param_bytes=100_000_000,
        grad_bytes=100_000_000,
        optimizer_bytes=200_000_000,
        logits_bytes=MICROBATCH * SEQ * 256 * 4,
        embed_param_count=1000,
        loss_hbm_bytes=1_000_000,
    )


# dense: query_proj offloaded, mlpwo recomputed; moe: moe_mlpwi_0 offloaded, key_proj on device.
PLAN = P.Plan(
    "hand",
    {
        "dense": P.GroupPlan(
            {
                N.DECODER_LAYER_INPUT: P.Placement.DEVICE,
                N.QUERY_PROJ: P.Placement.OFFLOAD,
                N.MLPWO: P.Placement.REMAT,
            }
        ),
        "moe": P.GroupPlan(
            {
                N.DECODER_LAYER_INPUT: P.Placement.DEVICE,
                N.MOE_MLPWI_0: P.Placement.OFFLOAD,
                N.KEY_PROJ: P.Placement.DEVICE,
            }
        ),
    },
)

# Compute: matmuls 3 × (dense 2·1 GFLOP + moe 3·4 GFLOP + head 8 388 608) / 1e12 = 3 ×
# 14.008388608e9 / 1e12 = 42.025165824 ms, plus non-matmul HBM traffic at 4 TB/s: dense layers 2 ×
# (4 + 8) MB, the loss 1 MB, AdamW 7 × the 100 MB of parameters (params, grads, 2 moments read;
# params, 2 moments written) = 725 MB → 0.18125 ms.
MATMUL_S = 0.042025165824
COMPUTE_S = MATMUL_S + 725e6 / 4e12
# Recompute: dense (0.5 unnamed + 1 mlpwo) GFLOP × 2 layers; moe 0 unnamed × 3 layers = 3e9 / 1e12;
# plus dense (2 unnamed + 2 mlpwo) MB × 2 layers = 8 MB at 4 TB/s = 2 µs.
RECOMPUTE_S = 0.003 + 8e6 / 4e12
# Transfers: dense 80 MB, moe 30 MB.  d2h at 10 GB/s: 8 ms + 3 ms; h2d at 5 GB/s: 16 ms + 6 ms.
TRANSFER_S = 0.008 + 0.003 + 0.016 + 0.006
# Hiding windows (compute seconds of the group): forward dense 2 ms + 2 × 4 MB at 4 TB/s (2 µs) =
# 2.002 ms, moe 12 ms; backward = 2·forward matmuls + backward HBM + unnamed recompute: dense 4 +
# 0.004 + 1 + 0.001 = 5.005 ms, moe 24 ms.
EXPOSED = {
    # serial: nothing hidden.
    "serial": (0.008 + 0.003, 0.016 + 0.006),
    # lhs: half the window. d2h dense 8 − 1.001 ms, moe 3 − 6 < 0 → 0; h2d dense 16 − 2.5025 ms, moe
    # 6 − 12 → 0.
    "lhs": (0.008 - 0.001001, 0.016 - 0.0025025),
    # lhs-pipelined: the whole window. d2h dense 8 − 2.002 ms; h2d dense 16 − 5.005 ms; moe hidden.
    "lhs-pipelined": (0.008 - 0.002002, 0.016 - 0.005005),
}
# Memory: state 400 MB; activations: carries 2 MB + 3 MB, moe key_proj 12 MB on device → 17 MB;
# staging: one layer of the group with the most offloaded, dense 40 MB (two layers when pipelined:
# 80 MB); workspace: the largest save-all layer, 50 MB.  That is the layer-backward phase (467 MB +
# staging); the loss phase is smaller: 400 MB − the embedding/head gradients (1000 params × 4 B) +
# 17 MB + the head's float32 gradient 64·256·4 = 65 536 B + logits and their gradient 2 · 4·64·256·4
# = 524 288 B = 417 585 824 B.
STAGING = {"serial": 40_000_000, "lhs": 40_000_000, "lhs-pipelined": 80_000_000}
PEAK_WITHOUT_STAGING = 400_000_000 + 17_000_000 + 50_000_000

# The prefetching scan (the default mechanism): query_proj, made before the attention, is stored in
# its own layer and loaded once more (the last layer's before the loop, layer 0 twice): dense loads
# (80 + 40) MB / 5 GB/s = 24 ms, both layers on the host (80 MB); moe_mlpwi_0 is stored a layer
# later, its last layer kept on device: 2 of its 3 layers on the host (20 MB), loads 30 MB = 6 ms
# (layer 0 twice, the last layer's not loaded); stores unchanged (8 + 3 ms).  Every copy can hide
# under a whole layer's window unless serial: d2h dense 8 − 2.002 ms, moe 0; h2d dense
# 24 − 5.005 ms, moe 6 − 24 → 0.  One layer of the dense group's offloaded slices
# is staged on device, any schedule: 40 MB (the next layer's prefetched slices; the slices of the
# layer in use are its residuals, in the 50 MB workspace).
PREFETCH_TRANSFER_S = 0.008 + 0.003 + 0.024 + 0.006
PREFETCH_EXPOSED = {
    "serial": (0.011, 0.030),
    "lhs": (0.008 - 0.002002, 0.024 - 0.005005),
    "lhs-pipelined": (0.008 - 0.002002, 0.024 - 0.005005),
}
PREFETCH_STAGING = 40_000_000


@pytest.mark.parametrize("mechanism", ["policy", "prefetch"])
@pytest.mark.parametrize("schedule", cm.SCHEDULES)
def test_simulate_equals_hand_computation(schedule, mechanism):
    plan = dataclasses.replace(PLAN, mechanism=mechanism)
    pred = cm.simulate(plan, for_inventory(CFG, inventory()), RATES, schedule)
    b = pred.breakdown
    if mechanism == "policy":
        (d2h, h2d), transfer, staging = EXPOSED[schedule], TRANSFER_S, STAGING[schedule]
    else:
        (d2h, h2d), transfer, staging = (
            PREFETCH_EXPOSED[schedule],
            PREFETCH_TRANSFER_S,
            PREFETCH_STAGING,
        )
    assert b.compute_s == pytest.approx(COMPUTE_S, rel=1e-12)
    assert b.recompute_s == pytest.approx(RECOMPUTE_S, rel=1e-12)
    assert b.transfer_s == pytest.approx(transfer, rel=1e-12)
    assert (b.exposed_d2h_s, b.exposed_h2d_s) == (
        pytest.approx(d2h, rel=1e-12, abs=1e-15),
        pytest.approx(h2d, rel=1e-12, abs=1e-15),
    )
    assert pred.step_time_s == pytest.approx(COMPUTE_S + RECOMPUTE_S + d2h + h2d, rel=1e-12)
    assert pred.host_bytes == 80_000_000 + (30_000_000 if mechanism == "policy" else 20_000_000)
    assert b.staging_bytes == staging
    assert b.activation_bytes == 17_000_000
    assert pred.peak_device_bytes == PEAK_WITHOUT_STAGING + staging


def test_save_all_group_keeps_every_residual_and_recomputes_nothing():
    plan = P.Plan(
        "dense-all",
        {
            "dense": P.GroupPlan(
                {N.QUERY_PROJ: P.Placement.DEVICE, N.MLPWO: P.Placement.DEVICE},
                P.Placement.DEVICE,
                (),
                P.Placement.DEVICE,  # no remat: the unnamed intermediates kept too
            ),
            "moe": P.GroupPlan({N.MOE_MLPWI_0: P.Placement.REMAT, N.KEY_PROJ: P.Placement.REMAT}),
        },
    )
    pred = cm.simulate(plan, for_inventory(CFG, inventory()), RATES, "lhs")
    # dense keeps its 50 MB/layer save-all residuals (2 layers); moe keeps its carries (3 MB).
    assert pred.breakdown.activation_bytes == 100_000_000 + 3_000_000
    # Only moe recomputes: (0 unnamed + 3 + 0.2) GFLOP × 3 layers = 9.6 GFLOP → 9.6 ms.
    assert pred.breakdown.recompute_s == pytest.approx(0.0096, rel=1e-12)
    assert pred.host_bytes == 0 and pred.breakdown.transfer_s == 0
    assert pred.step_time_s == pytest.approx(COMPUTE_S + 0.0096, rel=1e-12)


def test_slower_link_costs_exactly_the_extra_exposed_seconds():
    """Halving the d2h rate doubles the store times: serial exposes 11 ms more (dense 8, moe 3)."""
    slow = dataclasses.replace(RATES, d2h_bytes_per_s=5e9)
    a = cm.simulate(PLAN, for_inventory(CFG, inventory()), RATES, "serial").step_time_s
    b = cm.simulate(PLAN, for_inventory(CFG, inventory()), slow, "serial").step_time_s
    assert b - a == pytest.approx(0.011, rel=1e-9)


def test_traced_inventory_bytes_and_host_bytes_from_shapes():
    """tiny-llama at microbatch 2 × seq 16, float32: q is [2,16,4,16], k and v [2,16,2,16], mlpwo
    [2,16,64]."""
    cfg = get_config("tiny-llama")
    inv = model_inventory(cfg, 2, 16)
    (g,) = inv.groups
    per_layer = {a.name: a.bytes_per_layer for a in g.activations}
    assert per_layer[N.QUERY_PROJ] == 2 * 16 * 4 * 16 * 4 == 8192
    assert per_layer[N.KEY_PROJ] == per_layer[N.VALUE_PROJ] == 2 * 16 * 2 * 16 * 4 == 4096
    assert per_layer[N.MLPWO] == per_layer[N.DECODER_LAYER_INPUT] == 2 * 16 * 64 * 4 == 8192
    assert per_layer[N.MLPWI_0] == 2 * 16 * 128 * 4
    assert g.carry_bytes_per_layer == 8192 and g.num_layers == 4
    # Recompute FLOPs (32 tokens, d 64): q = [32,64]×[64,64]; k, v = [32,64]×[64,32]; gate =
    # [32,64]×[64,128]; attention_out = P·V over 2 sequences × 4 heads × 16×16 × 16; mlpwo is not
    # read by the backward: free.
    rec = {a.name: a.recompute_flops_per_layer for a in g.activations}
    assert rec[N.QUERY_PROJ] == 2 * 32 * 64 * 64
    assert rec[N.KEY_PROJ] == rec[N.VALUE_PROJ] == 2 * 32 * 64 * 32
    assert rec[N.MLPWI_0] == rec[N.MLPWI_1] == 2 * 32 * 64 * 128
    assert rec[N.ATTENTION_OUT] == 2 * 2 * 4 * 16 * 16 * 16
    assert rec[N.MLPWO] == 0
    # Forward: q, k, v, scores, P·V, out-projection, gate, up, down.
    assert (
        g.forward_flops_per_layer
        == 2 * 32 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128) + 2 * 65536
    )
    rates = cm.target_rates("h200", cfg.dtype)
    pred = cm.simulate(P.preset("qkv-offload", cfg), for_inventory(cfg, inv), rates, "serial")
    assert pred.host_bytes == 4 * (8192 + 4096 + 4096)
    # Serial: every byte crosses the link twice, exposed; 55 GB/s each way on h200; the prefetching
    # scan's backward loads 4 + 1 layers (layer 0 twice).
    assert pred.breakdown.exposed_d2h_s == pytest.approx(4 * 16384 / 55e9, rel=1e-12)
    assert pred.breakdown.exposed_h2d_s == pytest.approx(5 * 16384 / 55e9, rel=1e-12)
    # Logits: 2·16 tokens × 256 vocab × float32.
    assert inv.logits_bytes == 2 * 16 * 256 * 4


def test_loss_phase_peak_from_logits_and_head_gradient():
    """Big logits make the loss the peak: state without the embedding/head gradients, activations,
    staging, the
    head's unsharded float32 gradient and the float32 logits with their gradient (untiled: both
    whole)."""
    inv = dataclasses.replace(inventory(), logits_bytes=100_000_000)
    pred = cm.simulate(PLAN, for_inventory(CFG, inv), RATES, "lhs")
    assert pred.breakdown.peak_phase == "loss"
    assert (
        pred.peak_device_bytes
        == 399_996_000 + 17_000_000 + pred.breakdown.staging_bytes + 65_536 + 2 * 100_000_000
    )


def test_loss_gradient_is_in_the_compute_dtype():
    """bfloat16 compute: the logits stay float32 (100 MB) but their gradient is bfloat16 (50 MB),
    which the head's backward matmuls take (tierax.models.loss); the float32 logits die when it is
    made, so the head's float32 gradient (65 536 B) is live with the gradient only: the loss holds
    max(100 + 50 MB, 50 MB + 65 536 B).  Tiled under FSDP, one float32 [D, V] buffer fewer (no
    float32 copy of the gathered head) and half a tile's gradient."""
    cfg = dataclasses.replace(CFG, dtype="bfloat16")
    inv = dataclasses.replace(inventory(), logits_bytes=100_000_000)
    pred = cm.simulate(PLAN, for_inventory(cfg, inv), RATES, "lhs")
    assert pred.breakdown.peak_phase == "loss"
    assert (
        pred.peak_device_bytes
        == 399_996_000 + 17_000_000 + pred.breakdown.staging_bytes + 150_000_000
    )
    # Small logits: the head's gradient with the logits' gradient is the larger pair.
    small = dataclasses.replace(inventory(), logits_bytes=10_000)
    small_pred = cm.simulate(PLAN, for_inventory(cfg, small), RATES, "lhs")
    assert small_pred.breakdown.logits_bytes == 65_536 + 5_000
    tiled = dataclasses.replace(cfg, loss_tiles=4)
    fsdp = dataclasses.replace(inv, mesh={"data": 1, "fsdp": 2})
    f32 = cm.simulate(
        PLAN, for_inventory(dataclasses.replace(CFG, loss_tiles=4), fsdp), RATES, "lhs"
    )
    f32 = f32.breakdown.logits_bytes
    bf16 = cm.simulate(PLAN, for_inventory(tiled, fsdp), RATES, "lhs").breakdown.logits_bytes
    # float32: 2 head gradients + the tile + the gathered head (4 B); bfloat16: 1 + half the tile +
    # the head (2 B)
    assert f32 == 2 * 65_536 + 100_000_000 + 256 * 64 * 4
    assert bf16 == 65_536 + 50_000_000 + 256 * 64 * 2
    # A TPU target: the logits in the compute dtype (50 MB) and the head's float32 gradient, no
    # second logits-sized buffer (the step's TPU flags: costmodel.fixed._tpu_loss_phase_bytes), and
    # the final hidden states in float32 beside their bfloat16 gradient ([tokens, D] each).
    tpu = cm.simulate(
        PLAN, for_inventory(cfg, inv), dataclasses.replace(RATES, target="v5p"), "lhs"
    )
    tokens = inv.microbatch * inv.seq
    hidden = tokens * cfg.d_model * (4 + 2)
    assert tpu.breakdown.logits_bytes == 50_000_000 + 65_536 + hidden
    # Under FSDP also the head gathered in bfloat16 for the backward's matmul, and the larger of the
    # hidden pair and the head gradient's bfloat16 all-reduce (256 · 64 · 2 B each)
    rates = dataclasses.replace(RATES, target="v5p")
    tpu2 = cm.simulate(PLAN, for_inventory(cfg, fsdp), rates, "lhs").breakdown.logits_bytes
    assert tpu2 == 50_000_000 + 256 * 64 * 2 + 65_536 + max(hidden, 256 * 64 * 2)
    wide = dataclasses.replace(fsdp, microbatch=1, seq=1)  # a hidden pair smaller than the head
    small_hidden = cfg.d_model * (4 + 2)
    assert small_hidden < 256 * 64 * 2
    assert cm.simulate(PLAN, for_inventory(cfg, wide), rates, "lhs").breakdown.logits_bytes == (
        50_000_000 + 256 * 64 * 2 + 65_536 + 256 * 64 * 2
    )


def test_tiled_loss_on_tpu_holds_the_tiles_head_gradient_and_its_narrow_all_reduce():
    """A TPU target, loss_tiles=4, bfloat16 compute (XLA:TPU's live set at the loss scan's peak,
    bench/results/tpu_tiled_loss.json): one tile's logits in bfloat16 (50 MB of the inventory's
    100 MB float32), the tile's float32 head gradient (256 · 64 · 4 B), its all-reduce in bfloat16
    (256 · 64 · 2 B; without FSDP the bfloat16 accumulator, the same size), the final hidden states
    in float32 with their bfloat16 gradient, and under FSDP the head gathered in bfloat16."""
    cfg = dataclasses.replace(CFG, dtype="bfloat16", loss_tiles=4)
    inv = dataclasses.replace(inventory(), logits_bytes=100_000_000)
    rates = dataclasses.replace(RATES, target="v5p")
    hidden = inv.microbatch * inv.seq * cfg.d_model * (4 + 2)
    one = cm.simulate(PLAN, for_inventory(cfg, inv), rates, "lhs").breakdown.logits_bytes
    assert one == 50_000_000 + 256 * 64 * 4 + 256 * 64 * 2 + hidden
    fsdp = dataclasses.replace(inv, mesh={"data": 1, "fsdp": 2})
    two = cm.simulate(PLAN, for_inventory(cfg, fsdp), rates, "lhs").breakdown.logits_bytes
    assert two == 50_000_000 + 256 * 64 * 4 + 256 * 64 * 2 + hidden + 256 * 64 * 2


def test_tiled_loss_keeps_one_logits_tile_and_two_head_gradients_and_recomputes_the_head():
    """loss_tiles=4: one tile's logits gradient (100 MB here), the head-gradient scan accumulator in
    and out
    (2 · 65 536 B); the backward recomputes each tile's logits: one more head forward, 2·256·64·256
    FLOPs."""
    cfg = dataclasses.replace(CFG, loss_tiles=4)
    inv = dataclasses.replace(inventory(), logits_bytes=100_000_000)
    pred = cm.simulate(PLAN, for_inventory(cfg, inv), RATES, "lhs")
    assert (
        pred.peak_device_bytes
        == 399_996_000 + 17_000_000 + pred.breakdown.staging_bytes + 2 * 65_536 + 100_000_000
    )
    assert pred.breakdown.compute_s == pytest.approx(
        COMPUTE_S + 2 * 256 * 64 * 256 / 1e12, rel=1e-12
    )
    # Under FSDP the scan's body also holds the head gathered in the compute dtype (256 · 64 · 4 B,
    # float32 here) while it converts it; fsdp=2 also brings XLA's transposed stack copies
    # (tiny-deepseek, fsdp=2: dense wkv_b, wq_b, wi_0, wi_1; moe wkv_b, wq_b, shared wo, routed
    # wi_0/wi_1/wo — each stack over 2) and halves the embedding/head gradient shards (1000 × 4 B /
    # 2).
    copies = (
        2 * (16 * 128 + 32 * 96 + 2 * 64 * 128)
        + 2 * (16 * 128 + 32 * 96 + 32 * 64)
        + 3 * 2 * 8 * 64 * 32
    ) // 2
    sharded = cm.simulate(
        PLAN,
        for_inventory(cfg, dataclasses.replace(inv, mesh={"data": 1, "fsdp": 2})),
        RATES,
        "lhs",
    )
    assert sharded.breakdown.peak_phase == "loss"
    assert sharded.peak_device_bytes == (
        400_000_000
        - 2_000
        + 17_000_000
        + sharded.breakdown.staging_bytes
        + 2 * 65_536
        + 100_000_000
        + 65_536
        + 4 * copies
    )


def test_gpu_targets_add_xla_fixed_buffers_to_the_peak():
    """XLA:GPU's cuBLAS workspace (an s8[N] buffer in the peak set of every deviceless GPU
    compile; N by compute capability and jaxlib release: tests/test_gemm_workspace.py) adds to the
    peak once."""
    cfg = get_config("tiny-llama")
    inv = model_inventory(cfg, 2, 16)
    h200 = cm.target_rates("h200", cfg.dtype)
    fixed = h200.fixed_device_bytes
    assert fixed in (4 * 1024 * 1024, 32 * 1024 * 1024)  # the rule's two sizes
    without = cm.simulate(
        P.preset("remat-full", cfg),
        for_inventory(cfg, inv),
        dataclasses.replace(h200, fixed_device_bytes=0),
        "lhs",
    )
    with_ = cm.simulate(P.preset("remat-full", cfg), for_inventory(cfg, inv), h200, "lhs")
    assert with_.peak_device_bytes - without.peak_device_bytes == fixed


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    [
        ("tiny-llama", [], "remat-full", 8, 64),
        ("llama3-8b", ["num_layers=2"], "remat-full", 1, 4096),
    ],
)
def test_predicted_peak_within_10pct_of_the_deviceless_xla_gpu_compile(case):
    """Independent truth: XLA:GPU's own memory analysis of the compiled step (H200, one device).
    tiny-llama's peak is mostly XLA's fixed buffers (the cuBLAS workspace, 4 MiB or 32 MiB by jaxlib
    release: the compile's largest is the rates' term); llama3-8b's is the state with every gradient
    plus one layer's residuals."""
    pytest.importorskip("jax_plugins.xla_cuda13")
    from tierax.models import apply_overrides, for_platform
    from tierax.xla import compile as C

    model, overrides, plan_name, mb, seq = case
    # the attention a GPU runs (attention=auto is chosen per platform), as the compile resolves it
    cfg = for_platform(apply_overrides(get_config(model), overrides), "gpu")
    plan = P.preset(plan_name, cfg)
    pred = cm.simulate(
        plan,
        for_inventory(cfg, model_inventory(cfg, mb, seq)),
        cm.target_rates("h200", cfg.dtype),
        "lhs",
    )
    got, hlo = C.compile_for_target(cfg, plan, "h200", microbatch=mb, seq=seq)
    workspaces = re.findall(r"\(.*s8\[(\d+)\].*custom_call_target=\"__cublas", hlo)
    assert max(map(int, workspaces)) == cm.target_rates("h200", cfg.dtype).fixed_device_bytes
    assert abs(pred.peak_device_bytes / got.device_peak_bytes - 1) <= 0.10, (
        pred.breakdown,
        got.device_peak_bytes,
    )


def test_fsdp_workspace_counts_gathered_weights_and_the_head_gradient():
    """fsdp=2 × expert=2, float32 (tiny-deepseek's dtypes): a layer's workspace is its residuals
    plus its weights
    gathered — dense: 50 MB + 1000 × 4 B; moe: 20 MB + 1000 × 4 B (non-expert) + 10⁷ / 2 expert
    shards × 4 B, so dense's 50 004 000 B is the larger — plus, untiled, the smaller of the head's
    float32 gradient (64 · 256 · 4 = 65 536 B) and the logits' gradient (4·64 tokens · 256 · 4 = 262
    144 B).  No term for the gathered embedding and head, nor the embedding's gradient: not live
    while the layers are back-propagated."""
    inv = inventory()
    dense, moe = inv.groups
    moe = dataclasses.replace(
        moe, layer_param_count=10_001_000, expert_param_count_per_layer=10_000_000
    )
    inv = dataclasses.replace(inv, groups=(dense, moe), mesh={"data": 1, "fsdp": 2, "expert": 2})
    b = cm.simulate(PLAN, for_inventory(CFG, inv), RATES, "lhs").breakdown
    assert b.workspace_bytes == 50_000_000 + 4_000 + 65_536
    # Fewer tokens than d_model: the logits' gradient (10 000 B here) is the smaller of the two.
    few = cm.simulate(
        PLAN, for_inventory(CFG, dataclasses.replace(inv, logits_bytes=10_000)), RATES, "lhs"
    ).breakdown
    assert few.workspace_bytes == 50_000_000 + 4_000 + 10_000
    # The tiled loss reduce-scatters the head's gradient per tile: nothing [D, V] outlives it.
    tiled = cm.simulate(
        PLAN, for_inventory(dataclasses.replace(CFG, loss_tiles=4), inv), RATES, "lhs"
    ).breakdown
    assert tiled.workspace_bytes == 50_000_000 + 4_000


# tiny-deepseek's stacks (2 dense + 2 moe layers, d 64, float32) gathered through a transposed copy
# on fsdp=2 × expert=2 (non-expert weights over both, 4 ways; experts: E over expert, D over fsdp):
# those whose sharded dimension has a dimension > 1 before it in a layer's slice.  dense: wkv_b [16,
# 128/4], wq_b [32, 96/4], mlp wi_0 and wi_1 [64, 128/4]; moe: wkv_b, wq_b, the shared expert's wo
# [32, 64/4], the routed wi_0/wi_1 [8/2, 64/2, 32] and wo [8/2, 32, 64/2].  Not:
# wq_a/wkv_a/attention wo/mlp wo/router/shared wi_* (sharded first).
TINY_DS_TRANSPOSED = (
    2 * (16 * 128 + 32 * 96 + 2 * 64 * 128) // 4
    + 2 * (16 * 128 + 32 * 96 + 32 * 64) // 4
    + 3 * 2 * 8 * 64 * 32 // 4
)


def test_transposed_stack_copies_from_shapes():
    """The stacked weights XLA gathers through a transposed copy, counted from shapes; for
    llama3.1-405b these are
    the wrapped_transpose buffers of its deviceless compiles: fsdp=128: wi_0 and wi_1, [126, 16384,
    53248 / 128] each (f32[416,126,16384]); fsdp=16 × tensor=8: mlp wo [126, 53248 / 8, 16384 / 16]
    and attention wo [126, 16384 / 8, 16384 / 16] (wi_* are gathered along D, leading, there)."""
    from tierax.costmodel.fixed import transposed_stack_params

    assert TINY_DS_TRANSPOSED == 38_912
    assert transposed_stack_params(CFG, {"data": 1, "fsdp": 2, "tensor": 1, "expert": 2}) == 38_912
    assert transposed_stack_params(CFG, {"data": 1, "fsdp": 1, "tensor": 1, "expert": 1}) == 0
    # fsdp=2 × expert=8: non-expert weights over 16; one expert per device, so a routed wi_0/wi_1
    # slice is [1, 64/2, 32] — gathered along its first dimension of more than one element, no copy
    # — while wo's [1, 32, 64/2] needs one.  The deviceless compile (16 H200s) has exactly these
    # copies: dense wkv_b [2, 16, 8], wq_b [2, 32, 6], wi_0/wi_1 [2, 64, 8]; moe wkv_b, wq_b, shared
    # wo [2, 32, 4], routed wo [2, 1, 32, 32].
    assert transposed_stack_params(CFG, {"data": 1, "fsdp": 2, "tensor": 1, "expert": 8}) == (
        2 * (16 * 8 + 32 * 6 + 2 * 64 * 8) + 2 * (16 * 8 + 32 * 6 + 32 * 4) + 2 * 1 * 32 * 32
    )
    big = get_config("llama3.1-405b")
    assert transposed_stack_params(big, {"fsdp": 128}) == 2 * 126 * 16384 * 416
    assert (
        transposed_stack_params(big, {"fsdp": 16, "tensor": 8})
        == 126 * 6656 * 1024 + 126 * 2048 * 1024
    )


def test_transposed_stack_copies_count_in_both_phases():
    """tiny-deepseek on fsdp=2 × expert=2: the copies (38 912 × 4 B) add to the layer phase's and
    the loss's peak."""
    inv = dataclasses.replace(inventory(), mesh={"data": 1, "fsdp": 2, "expert": 2})
    pred = cm.simulate(PLAN, for_inventory(CFG, inv), RATES, "lhs")
    b = pred.breakdown
    assert b.stack_copy_bytes == 38_912 * 4
    assert b.peak_phase == "layer backward"
    # state 400 MB + activations 17 MB + dense workspace (50 MB + 1000 × 4 B) + head gradient 65 536
    # B + copies.
    assert (
        pred.peak_device_bytes
        == 400_000_000 + 17_000_000 + b.staging_bytes + 50_004_000 + 65_536 + 155_648
    )
    loss = cm.simulate(
        PLAN, for_inventory(CFG, dataclasses.replace(inv, logits_bytes=100_000_000)), RATES, "lhs"
    )
    assert loss.breakdown.peak_phase == "loss"
    # state less the embedding/head gradient shards (1000 × 4 B / 4), activations, staging, head
    # weight in float32, logits and their gradient, copies.
    assert loss.peak_device_bytes == (
        400_000_000
        - 1_000
        + 17_000_000
        + loss.breakdown.staging_bytes
        + 65_536
        + 2 * 100_000_000
        + 155_648
    )


# The routed experts' backward holds dispatch-sized buffers besides the layer's residuals ([E, C, D]
# per device in the compute dtype, C = ceil(tokens · top-k / E · capacity factor)): the expert
# outputs' gradient and the expert inputs' gradient, and under expert parallelism that gradient's
# re-laid all-to-all send copy and the recomputed combine's send buffer.  DeepSeek-V3, 8 × 4096
# tokens per device, expert=8 (deviceless XLA:GPU, 128 GB200, fsdp=16,expert=8, remat-full):
# bf16[32,8192,7168] dispatch/expert-input gradient, bf16[32,8,1024,7168] output gradient,
# bf16[8,32,1024,7168] send copies, each 256 · 1024 · 7168 · 2 = 3 758 096 384 B.
def test_moe_backward_buffers_from_shapes():
    from tierax.models import moe

    ds = get_config("deepseek-v3-671b")  # 256 experts, top-8, capacity factor 1, d 7168, bfloat16
    assert moe.backward_buffer_bytes(ds, 8 * 4096, 8) == 4 * 256 * 1024 * 7168 * 2 == 15_032_385_536
    assert (
        moe.backward_buffer_bytes(ds, 8 * 4096, 1) == 2 * 256 * 1024 * 7168 * 2
    )  # no all-to-all: no send copies
    # tiny-deepseek: 8 experts, top-2, capacity factor 1.25, d 64, float32; 256 tokens → C =
    # ceil(80) = 80, 100 tokens → ceil(31.25) = 32.
    assert moe.backward_buffer_bytes(CFG, 256, 2) == 4 * 8 * 80 * 64 * 4 == 655_360
    assert moe.backward_buffer_bytes(CFG, 100, 2) == 4 * 8 * 32 * 64 * 4


def test_moe_layer_workspace_adds_its_backward_buffers():
    """The hand inventory's moe group made the largest (60 MB of residuals, 10⁷ expert + 1000 other
    parameters) on
    tiny-deepseek's shapes (float32, 256 tokens per device, C = 80): expert=2 → residuals + the 1000
    non-expert weights gathered over fsdp × expert (4 000 B) + four [8, 80, 64] float32 buffers (655
    360 B) + the head's float32 gradient (64 · 256 · 4 = 65 536 B); fsdp=2 → two buffers (327 680 B)
    and the experts gathered over fsdp (10⁷ × 4 B).  The dense group, with no experts, has none."""
    dense, moe_g = inventory().groups
    moe_g = dataclasses.replace(
        moe_g,
        save_all_bytes_per_layer=60_000_000,
        layer_param_count=10_001_000,
        expert_param_count_per_layer=10_000_000,
    )
    inv = dataclasses.replace(
        inventory(), groups=(dense, moe_g), mesh={"data": 1, "fsdp": 1, "expert": 2}
    )
    assert cm.simulate(PLAN, for_inventory(CFG, inv), RATES, "lhs").breakdown.workspace_bytes == (
        60_000_000 + 4_000 + 4 * 8 * 80 * 64 * 4 + 65_536
    )
    inv = dataclasses.replace(inv, mesh={"data": 1, "fsdp": 2, "expert": 1})
    assert cm.simulate(PLAN, for_inventory(CFG, inv), RATES, "lhs").breakdown.workspace_bytes == (
        60_000_000 + 4_000 + 40_000_000 + 2 * 8 * 80 * 64 * 4 + 65_536
    )
    # Dense group the largest again (residuals 50 MB + 4 000 B gathered): no buffers.
    small = dataclasses.replace(moe_g, save_all_bytes_per_layer=1_000_000)
    inv = dataclasses.replace(inv, groups=(dense, small), mesh={"data": 1, "fsdp": 1, "expert": 2})
    assert (
        cm.simulate(PLAN, for_inventory(CFG, inv), RATES, "lhs").breakdown.workspace_bytes
        == 50_004_000 + 65_536
    )


def test_fits_leaves_the_runtime_reserve_free_in_simulate_plan_and_sweeps():
    """A predicted peak between the usable limit (capacity less the runtime reserve) and the raw
    capacity does not fit: simulate says so, the planner's default budget avoids it, and a sweep's
    reference curve marks it."""
    from tierax import hardware
    from tierax.solving import planner, whatif

    cfg = get_config("tiny-llama")
    inv = model_inventory(cfg, 8, 64, {})
    rates = cm.target_rates("h200", cfg.dtype)
    save_all = P.preset("save-all", cfg)
    peak = cm.simulate(save_all, for_inventory(cfg, inv), rates, "lhs").peak_device_bytes
    tight = dataclasses.replace(
        rates, device_memory_bytes=int(peak / (1 - hardware.RUNTIME_RESERVE_FRACTION / 2))
    )  # peak < capacity, > usable
    roomy = dataclasses.replace(
        rates, device_memory_bytes=int(peak / (1 - 2 * hardware.RUNTIME_RESERVE_FRACTION))
    )
    between = cm.simulate(save_all, for_inventory(cfg, inv), tight, "lhs")
    assert between.peak_device_bytes == peak < between.device_capacity_bytes and not between.fits
    assert cm.simulate(save_all, for_inventory(cfg, inv), roomy, "lhs").fits
    # the default budget: the usable bytes
    planned = planner.plan(for_inventory(cfg, inv), tight).predicted
    assert planned.fits and planned.peak_device_bytes < peak
    solve = whatif.plan_solver(
        cfg, {}, 64, 8, tight, schedule="lhs", budget_bytes=None, host_budget_bytes=None
    )
    point = whatif.sweep("microbatch", [8.0], solve=solve, references=["save-all"])[0]
    assert point.reference["save-all"] is None and point.peak_device_bytes < peak


def test_a_config_with_its_inventory_is_refused_naming_the_front_end():
    """The cost model and the planner price a Program, never a tierax config: each entry point
    given an inventory and its config (in the order of the older signatures), or an inventory as
    ``prog=``, refuses it before any work, naming the front end that builds the program; the
    program that front end builds from the same pair is priced."""
    from tierax.costmodel import fixed
    from tierax.solving import planner

    inv = inventory()
    calls = {  # the name, the type refused, the call
        "simulate": ("Inventory", lambda: cm.simulate(PLAN, inv, CFG, RATES, "lhs")),
        "evaluate": ("Inventory", lambda: cm.evaluate({}, inv, CFG, RATES, "lhs")),
        "fixed_terms": ("Inventory", lambda: fixed.fixed_terms(inv, CFG, RATES, "lhs")),
        "collective_s_by_group": (
            "Inventory",
            lambda: fixed.collective_s_by_group(inv, CFG, RATES),
        ),
        "plan": ("DeepSeekConfig", lambda: planner.plan(CFG, inv, RATES)),
    }
    for name, (refused, call) in calls.items():
        with pytest.raises(TypeError, match=rf"\.{name} takes a Program, not {refused} "):
            call()
    with pytest.raises(TypeError, match=r"not Inventory .*for_inventory\(cfg, inventory\)"):
        cm.simulate(PLAN, prog=inv, rates=RATES, schedule="lhs")
    assert cm.simulate(PLAN, for_inventory(CFG, inv), RATES, "lhs").peak_device_bytes > 0
