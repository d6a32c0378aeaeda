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


def test_host_peak_shares_on_a_gpu_and_holds_both_on_a_tpu():
    from tierax.costmodel.state import host_peak

    mib = 2**20
    # 6 MiB of activations, 10 MiB of state: the update's second buffer in the activations'
    # memory (GPU) — state + max(6, 10) — or beside it (TPU) — state + 6 + 10
    assert host_peak(6 * mib, 10 * mib) == 20 * mib
    assert host_peak(6 * mib, 10 * mib, shares=False) == 26 * mib
    assert host_peak(6 * mib, 0, shares=False) == 6 * mib  # no state: the activations alone
    assert host_peak(12 * mib, 10 * mib) == 22 * mib  # more activations than state: theirs


def test_xla_tpu_holds_the_updates_state_beside_the_offloaded_activations(monkeypatch):
    """A deviceless v5e compile of qkv-offload with the moments on the host: XLA:TPU's host temp is
    the offloaded activations plus the update's second buffer of the state (not the larger of the
    two, as XLA:GPU's), and the model's host bytes are its host arguments plus that temp."""
    pytest.importorskip("libtpu")
    from tierax.models import apply_overrides, for_platform

    # libtpu's environment as tierax's deviceless start sets it (the suite's workers share it)
    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")
    sets = ["d_model=256", "mlp_dim=512", "num_heads=2", "num_kv_heads=2", "head_dim=128",
            "num_layers=2", "vocab_size=1024", "attention=blockwise"]  # fmt: skip
    cfg = for_platform(apply_overrides(get_config("tiny-llama"), sets), "tpu")
    plan = dataclasses.replace(
        P.preset("qkv-offload", cfg), state={"decoder": {"moments": "offload"}}
    )
    r, _ = C.compile_for_target(cfg, plan, "v5e", microbatch=4, seq=256)
    acts = sum(o.host_bytes for o in r.offloaded)
    state = r.host_argument_bytes
    assert acts > 0 and state == r.state_host_bytes > 0  # the case reached: both on the host
    # XLA:TPU's temp holds both (a few KiB of its own beside them)
    assert r.host_temp_bytes == pytest.approx(acts + state, rel=0.002)
    assert r.host_temp_bytes > max(acts, state) * 1.3
    assert r.predicted["host_bytes"] == pytest.approx(r.host_temp_bytes + state, rel=0.002)
    # the step of the compiled program: the model's, XLA's own recompute, loads beyond the model's
    loads = r.overlap["by_direction"]["h2d"]["est_exposed_s"]
    excess = max(0.0, loads - r.predicted["model_load_exposed_s"])
    assert r.predicted["compiled_step_s"] == pytest.approx(
        r.predicted["model_step_s"] + r.xla_recompute["est_s"] + excess
    )
