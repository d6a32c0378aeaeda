"""Deviceless XLA:GPU compile of a plan with moments in host memory: XLA's host arguments are the
plan's offloaded state bytes and the device peak falls by about them (tierax.train.streamed)."""

from __future__ import annotations

import dataclasses

import pytest

from tierax import plan as P
from tierax.models import get_config
from tierax.xla import compile as C


@pytest.mark.slow  # two deviceless compiles, ~25 s each on this shared machine
def test_host_moments_leave_the_device_in_xlas_compile():
    cfg = get_config("tiny-llama")
    base = P.preset("minimal", cfg)
    plan = dataclasses.replace(base, state={"decoder": {"moments": "offload"}})
    on_host, _ = C.compile_for_target(cfg, plan, "h200", microbatch=2, seq=64)
    on_device, _ = C.compile_for_target(cfg, base, "h200", microbatch=2, seq=64)
    # The decoder's mu and nu, float32, by hand: 2 moments × 4 bytes × its parameters.
    decoder = sum(
        cfg.num_layers * n
        for n in (
            cfg.d_model * cfg.num_heads * cfg.head_dim * 2,  # wq, wo
            cfg.d_model * cfg.num_kv_heads * cfg.head_dim * 2,  # wk, wv
            cfg.d_model * cfg.mlp_dim * 3,  # wi_0, wi_1, wo
            cfg.d_model * 2,  # two norms
        )
    )
    moments = 2 * 4 * decoder
    assert on_host.state_host_bytes == moments
    assert on_host.host_argument_bytes == moments
    assert on_device.device_argument_bytes - on_host.device_argument_bytes == moments
    # The device peak falls by at least 98 % of the offloaded moments (the streamed update stages
    # one layer's).
    fall = on_device.device_peak_bytes - on_host.device_peak_bytes
    assert 0.98 * moments <= fall <= moments
    assert any("training state offloaded by the plan" in n for n in on_host.notes)
