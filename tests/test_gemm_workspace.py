"""XLA:GPU's fixed device bytes (its cuBLAS workspace) by compute capability and jaxlib release
(tierax.costmodel.rates.xla_gpu_fixed_bytes): the rule by hand on both sides of each threshold, and
against the workspace XLA:GPU itself gives the GEMMs of a scanned layer's gradient in a deviceless
compile for each GPU target, under the installed jaxlib.  The compiles per release that fix the
thresholds (0.10.2, 0.11.0: 4 MiB everywhere; 0.11.1, 0.11.2, 0.12.0.1: 32 MiB from 9.0 on) are
bench/results/gemm_workspace.json's."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from tierax import costmodel as cm
from tierax import hardware
from tierax.costmodel import rates as R
from tierax.errors import TieraxError

MIB = 2**20


@pytest.mark.parametrize(
    "capability, jaxlib, mib",
    [
        # the release threshold at Hopper: 0.11.0 compiles no dynamic-slice fusion, 0.11.1 does
        ((9, 0), "0.10.2", 4),
        ((9, 0), "0.11.0", 4),
        ((9, 0), "0.11.0.1", 4),
        ((9, 0), "0.11.1", 32),
        ((9, 0), "0.11.1.dev20260901", 32),
        ((9, 0), "0.11.2", 32),
        ((9, 0), "0.12.0.1", 32),
        ((9, 0), "0.13", 32),
        ((9, 0), "1.0.0", 32),
        # the capability threshold at a release that fuses: Ada (8.9) is not Hopper
        ((8, 9), "0.12.0.1", 4),
        ((8, 0), "0.12.0.1", 4),
        ((10, 0), "0.12.0.1", 32),
        ((10, 3), "0.11.1", 32),
        ((12, 0), "0.12.0.1", 32),
        ((10, 0), "0.11.0", 4),
    ],
)
def test_the_rule_by_hand(capability, jaxlib, mib):
    assert R.xla_gpu_fixed_bytes(capability, jaxlib) == mib * MIB
    source = R.xla_gpu_fixed_source(capability, jaxlib)
    assert f"{mib} MiB for compute capability {'.'.join(map(str, capability))}" in source
    assert f"jaxlib {jaxlib}" in source and "cublasSetWorkspace" in source


@pytest.mark.parametrize("bad", ["", "dev", "v0.12"])
@pytest.mark.parametrize("capability", [(8, 0), (9, 0)])
def test_a_version_that_is_no_release_number_is_refused(bad, capability):
    with pytest.raises(TieraxError, match="is not a release number: give one such as 0.11.2"):
        R.xla_gpu_fixed_bytes(capability, bad)


def test_a_capability_that_is_not_major_minor_is_refused():
    with pytest.raises(TieraxError, match=r"is not \(major, minor\)"):
        R.xla_gpu_fixed_bytes((9,), "0.12.0.1")


@pytest.mark.parametrize("target", ["h100", "h200", "b200", "gb200"])
def test_every_gpu_target_takes_the_rule_at_the_installed_jaxlib(target):
    rates = cm.target_rates(target, "bfloat16")
    spec = hardware.get_target(target)
    want = R.xla_gpu_fixed_bytes(spec.compute_capability, R.installed_jaxlib())
    assert rates.fixed_device_bytes == want > 0
    assert rates.sources["fixed"] == R.xla_gpu_fixed_source(
        spec.compute_capability, R.installed_jaxlib()
    )


@pytest.mark.parametrize("target", ["cpu", "v5p"])
def test_no_fixed_gpu_bytes_off_the_gpu(target, tmp_path, monkeypatch):
    if target == "cpu":  # its rates come from a calibration: a hand-made one (its figures do not
        # decide the fixed bytes; the measured one is the calibrated_cpu fixture's, -m slow)
        from test_time_model import CAL

        f = tmp_path / "calibration.json"
        f.write_text(json.dumps(CAL))
        monkeypatch.setenv("TIERAX_CALIBRATION", str(f))
    rates = cm.target_rates(target, "float32")
    assert rates.fixed_device_bytes == 0 and "fixed" not in rates.sources


def _workspaces(hlo_text: str) -> list[int]:
    """The workspace (the ``s8[N]`` result element) of every cuBLAS call in a compiled module."""
    out = []
    for line in hlo_text.splitlines():
        if 'custom_call_target="__cublas' in line and "custom-call(" in line:
            out += [int(n) for n in re.findall(r"s8\[(\d+)\]", line.split("custom-call(")[0])]
    return out


def _compile_scanned_grad(target_config: str) -> str:
    """The gradient of a scanned, rematted 2-layer MLP (weights stacked [2, 64, 64]) compiled for
    one compile-only GPU of ``target_config``: its optimized HLO."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from tierax.xla.compile import gpu_topology, without_persistent_cache

    topo = gpu_topology(target_config, 1, "test")
    s = NamedSharding(Mesh(np.array(topo.devices), ("d",)), PartitionSpec())

    def loss(ws, x):
        h, _ = jax.lax.scan(jax.checkpoint(lambda h, w: (jnp.tanh(h @ w), None)), x, ws)
        return jnp.sum(h * h)

    ws = jax.ShapeDtypeStruct((2, 64, 64), jnp.float32, sharding=s)
    x = jax.ShapeDtypeStruct((128, 64), jnp.float32, sharding=s)
    lowered = jax.jit(jax.grad(loss)).trace(ws, x).lower(lowering_platforms=("cuda",))
    with without_persistent_cache():  # a compile-only client writes no cache entry
        return lowered.compile().as_text()


@pytest.mark.parametrize("target", ["h100", "h200", "b200", "gb200", "sm_80"])
def test_the_rule_is_the_workspace_xla_gives_a_scanned_layers_gemms(target):
    """XLA's own compile, under the installed jaxlib, for each GPU target's config as tierax
    renders it (``sm_80``, the side below the threshold: the H100's with compute capability 8.0 and
    without the architecture-specific features, which exist from 9.0 on): the largest cuBLAS
    workspace in the program is the rule's."""
    pytest.importorskip("jax_plugins.xla_cuda13")
    from tierax.hardware.target_config import render_target_config

    if target == "sm_80":
        spec = dataclasses.replace(hardware.get_target("h100"), compute_capability=(8, 0))
        text = render_target_config(spec).replace("8.0a", "8.0")
        text = re.sub(r"\n\s*feature_extension: ACCELERATED_FEATURES", "", text)
    else:
        spec = hardware.get_target(target)
        text = render_target_config(spec)
    assert f"major: {spec.compute_capability[0]}" in text
    got = _workspaces(_compile_scanned_grad(text))
    assert got, "the compile holds no cuBLAS call (are Triton GEMMs off? tierax.launch.flags)"
    assert max(got) == R.xla_gpu_fixed_bytes(spec.compute_capability, R.installed_jaxlib())
