"""The static overlap check on XLA:TPU's program: the splash kernel's Pallas calls timed at the
fused attention rates, and host copies moved in the host buffer's tiles.  Scheduled HLO written
by hand in the form XLA:TPU prints (a call's line as a deviceless v5e compile of tiny-llama with
attention=splash writes it), answers computed by hand."""

import dataclasses

import pytest

from tierax import costmodel as cm
from tierax.xla import hlo, splash_calls

# A head-dim-64 layer: batch 8, 32 query and 8 key/value heads, sequence 2048.
Q = "bf16[8,32,2048,64]{3,2,1,0:T(8,128)(2,1)}"
KV = "bf16[8,8,2048,64]{3,2,1,0:T(8,128)(2,1)}"
MASK = "s8[1,4,4]{2,1,0:T(4,128)(4,1)}"
TPU_CALL = 'custom_call_target="tpu_custom_call"'
# FlashAttention's causal forward, by hand: 4 · 8 · 32 · 2048² · 64 / 2
FWD_FLOPS = 4 * 8 * 32 * 2048**2 * 64 / 2
F32 = "f32[1024,1024]{1,0}"
HOST = "f32[1024,1024]{1,0:S(5)}"


def _rates(fwd: float, bwd: float) -> cm.Rates:
    """v5e's rates with the fused attention at fixed forward and backward FLOP/s (no table)."""
    base = cm.target_rates("v5e", "bfloat16", calibration={})
    return dataclasses.replace(
        base,
        fused_attention_table=(),
        fused_attention_fwd_flops_per_s=fwd,
        fused_attention_bwd_flops_per_s=bwd,
    )


def _module(lines: str) -> hlo.Module:
    return hlo.parse_module(
        "HloModule m, is_scheduled=true\n\n"
        f"ENTRY %main (m0: s8[1,4,4], q: bf16[8,32,2048,64], k: bf16[8,8,2048,64], "
        f"v: bf16[8,8,2048,64], p0: f32[1024,1024]) -> f32[1024,1024] {{\n"
        f"  %m0 = {MASK} parameter(0)\n  %q = {Q} parameter(1)\n  %k = {KV} parameter(2)\n"
        f"  %v = {KV} parameter(3)\n  %p0 = {F32} parameter(4)\n{lines}}}\n"
    )


def _call(name: str, out: str = Q) -> str:
    return f"  %{name} = {out} custom-call(%m0, %m0, %q, %k, %v), {TPU_CALL}\n"


def test_each_kernel_is_timed_at_its_direction_and_share():
    m = _module(
        _call("splash_mha_fwd_no_residuals.7")
        + _call("splash_mha_dkv_no_residuals.3", f"({KV}, {KV})")
        + _call("splash_mha_dq_no_residuals.3")
        + f"  ROOT %other = {Q} custom-call(%q), custom_call_target=\"ConcatBitcast\"\n"
    )
    rates = _rates(fwd=1e12, bwd=2e12)
    s = {n: splash_calls.seconds(rates, m, m.by_name[n]) for n in m.by_name}
    assert s["splash_mha_fwd_no_residuals.7"] == pytest.approx(FWD_FLOPS / 1e12)
    # the backward: 2.5 × the forward's FLOPs at 2 TFLOP/s, 4 of its 7 matmuls in dK/dV, 3 in dQ
    assert s["splash_mha_dkv_no_residuals.3"] == pytest.approx(2.5 * FWD_FLOPS * 4 / 7 / 2e12)
    assert s["splash_mha_dq_no_residuals.3"] == pytest.approx(2.5 * FWD_FLOPS * 3 / 7 / 2e12)
    assert s["other"] is None and s["q"] is None


def test_a_kernel_measured_by_shape_is_timed_at_the_calls_own_shape():
    m = _module(_call("splash_mha_fwd_residuals.3", f"({Q}, f32[8,32,2048,128])"))
    table = ((2048, 64, 4e13, 3e13), (2048, 128, 8e13, 6e13))
    rates = dataclasses.replace(_rates(1.0, 1.0), fused_attention_table=table)
    t = splash_calls.seconds(rates, m, m.by_name["splash_mha_fwd_residuals.3"])
    assert t == pytest.approx(FWD_FLOPS / 4e13)  # head dim 64's point, not 128's


def _store_under(window_line: str) -> str:
    # A 4 MiB store issued before ``window_line`` and awaited after it.
    return (
        f"  %st = ({F32}, {HOST}, u32[]) copy-start(%p0)\n"
        + window_line
        + f"  ROOT %dst = {HOST} copy-done(%st)\n"
    )


def test_a_store_hides_under_a_splash_call_that_the_roofline_counts_as_nothing():
    # The link moves the store's 4 MiB in 1 ms; the forward call takes FWD_FLOPS / 1e14 ≈ 1.37 ms.
    m = _module(_store_under(_call("splash_mha_fwd_no_residuals.7")))
    link = 4 * 1024**2 / 1e-3
    common = dict(peak_flops=1e15, hbm_bytes_per_s=1e30, host_link_bps=link)
    rates = _rates(fwd=1e14, bwd=1e14)
    (alone,) = hlo.host_transfers(m, **common)
    (timed,) = hlo.host_transfers(m, **common, kernel_s=splash_calls.kernel_seconds(rates))
    assert alone.est_stall_s == pytest.approx(1e-3, rel=1e-6)  # nothing to hide under
    assert timed.est_compute_between_s == pytest.approx(FWD_FLOPS / 1e14)
    assert timed.est_stall_s == pytest.approx(0, abs=1e-12)


def test_a_copy_moves_the_host_buffers_tiles():
    # q's 64-wide minor dimension is padded to the 128-lane tile in its host buffer: the link
    # moves 128 of its 64 MiB, so it takes twice as long as its logical bytes.
    host_q = "bf16[8,32,2048,64]{3,2,1,0:T(8,128)(2,1)S(5)}"
    m = _module(
        f"  %st = ({Q}, {host_q}, u32[]) copy-start(%q)\n  ROOT %dst = {host_q} copy-done(%st)\n"
    )
    (t,) = hlo.host_transfers(m, peak_flops=1e15, hbm_bytes_per_s=1e30, host_link_bps=1e9)
    assert t.bytes == 2 * 8 * 32 * 2048 * 64 * 2
    assert t.est_transfer_s == pytest.approx(t.bytes / 1e9)
