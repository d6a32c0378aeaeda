"""bench/investigations/tpu_tiled_loss.py reads XLA's live-range and buffer-assignment dumps:
checked on a real XLA:CPU dump of a small jitted ``step`` (XLA writes the same reports for every
backend), against the shapes the function has by construction."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

STEP = """
import jax, jax.numpy as jnp
def step(x, y):
    a = jnp.sin(x) @ y
    return jnp.cos(a) @ y, a.sum()
jax.jit(step)(jnp.ones((512, 512)), jnp.ones((512, 512)))
"""


def test_live_at_peak_reads_xla_s_own_dump(tmp_path):
    dump = tmp_path / "dump"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_dump_to={dump}"}
    subprocess.run([sys.executable, "-c", STEP], env=env, check=True, timeout=300)
    sys.path.insert(0, str(ROOT / "bench" / "investigations"))
    try:
        from tpu_tiled_loss import live_at_peak
    finally:
        sys.path.remove(str(ROOT / "bench" / "investigations"))

    live = live_at_peak(dump, big=1)
    values = live["values"]
    # The report's peak is the sum of the values it lists there, each read with its size.
    assert live["live_peak_bytes"] == sum(v["bytes"] for v in values)
    assert [v["bytes"] for v in values] == sorted((v["bytes"] for v in values), reverse=True)
    # Both arguments are live at the peak, as 512 x 512 float32 (1 MiB), named by the HLO's
    # metadata; every 1 MiB value is such a matrix, and the scalar sum is 4 bytes.
    args = {v["op_name"] for v in values if v["shape"] == "f32[512,512]"}
    assert {"x", "y"} <= args
    assert all(v["shape"] == "f32[512,512]" for v in values if v["bytes"] == 2**20)
    assert all(v["bytes"] == 4 for v in values if v["shape"] == "f32[]")
    # XLA:CPU has one memory space: everything is the device's.
    assert live["live_peak_device_bytes"] == live["live_peak_bytes"]
    assert all(v["device"] for v in values)
    assert live_at_peak(dump)["values"] == []  # nothing of 64 MiB
