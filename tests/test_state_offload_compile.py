"""Deviceless XLA:GPU compile of a plan with moments in host memory: XLA's host arguments are the
plan's offloaded state bytes, its host temp the update's second buffer of them, and the device peak
falls by about them (tierax.train.streamed)."""

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
    # The update writes the new moments into a second host buffer (host temp; minimal offloads no
    # activation), and the model counts both: host bytes = state + max(activations, state).
    assert on_host.host_temp_bytes == moments
    assert on_host.predicted["host_bytes"] == 2 * moments
    assert on_device.device_argument_bytes - on_host.device_argument_bytes == moments
    # The device peak falls by at least 98 % of the offloaded moments (the streamed update stages
    # one layer's).
    fall = on_device.device_peak_bytes - on_host.device_peak_bytes
    assert 0.98 * moments <= fall <= moments
    assert any("training state offloaded by the plan" in n for n in on_host.notes)


@pytest.mark.slow  # two deviceless compiles, ~20 s each on this shared machine
def test_host_masters_leave_the_device_in_xlas_compile():
    """master_weights offloaded (bfloat16 compute, float32 masters): XLA's host arguments are the
    decoder's float32 kernels, counted by hand; the device's arguments fall by their float32
    bytes less the bfloat16 copy the device keeps, and the device peak by at least that."""
    cfg = dataclasses.replace(get_config("tiny-llama"), dtype="bfloat16", param_dtype="float32")
    base = P.preset("minimal", cfg)
    plan = dataclasses.replace(base, state={"decoder": {"master_weights": "offload"}})
    on_host, _ = C.compile_for_target(cfg, plan, "h200", microbatch=2, seq=64)
    on_device, _ = C.compile_for_target(cfg, base, "h200", microbatch=2, seq=64)
    kernels = cfg.num_layers * (
        cfg.d_model * cfg.num_heads * cfg.head_dim * 2  # wq, wo
        + cfg.d_model * cfg.num_kv_heads * cfg.head_dim * 2  # wk, wv
        + cfg.d_model * cfg.mlp_dim * 3  # wi_0, wi_1, wo
    )
    norms = cfg.num_layers * cfg.d_model * 2  # used in float32: they stay on the device
    assert on_host.host_argument_bytes == 4 * kernels
    # The cost model prices every parameter of the group (the norms too): within 2 %.
    assert on_host.state_host_bytes == 4 * (kernels + norms)
    assert abs(on_host.host_argument_bytes / on_host.state_host_bytes - 1) < 0.02
    freed = (4 - 2) * kernels  # float32 masters out, bfloat16 copies in
    assert on_device.device_argument_bytes - on_host.device_argument_bytes == freed
    assert on_device.device_peak_bytes - on_host.device_peak_bytes >= 0.98 * freed


def test_host_bytes_over_the_targets_host_memory_refused_before_compiling():
    from tierax.errors import TieraxError
    from tierax.models import for_platform

    cfg = for_platform(get_config("llama3-8b"), "gpu")
    everything = {n: "offload" for n in cfg.layer_groups()[0].activations}
    plan = P.Plan.from_dict(
        {
            "plan": "all-host",
            "groups": {"decoder": everything | {"decoder_layer_input": "device"}},
            "state": {"decoder": {"moments": "offload"}},
        }
    )
    with pytest.raises(TieraxError, match=r"GiB per device in host memory .*training state 52\.00"):
        C.compile_for_target(cfg, plan, "h200", microbatch=32, seq=8192)
