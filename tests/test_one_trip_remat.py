"""A one-layer group's remat is recomputed, not merged back into the forward.

XLA removes a one-trip layer loop, which puts a layer's forward and its backward's recomputation in
one computation; with ``jax.checkpoint(prevent_cse=False)`` XLA:TPU then merges the two and keeps
the forward's values, so remat-full compiled to the save-all program (the MLA + MoE chip case's
one dense layer: its recomputation priced, none run).  The decoder prevents that merge where a
scan makes one trip (``tierax.models.decoder.single_trip``).  Checked against XLA:TPU's own
compile: in a one-layer model remat-full holds more matmuls than save-all (the recomputation),
as in a two-layer one, where the loop keeps the two apart."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from tierax.models.decoder import single_trip

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None

_COMPILE = r"""
import json, re, sys
from tierax import launch
launch.start_deviceless_tpu(accelerator_type="v5litepod-1")
from tierax.models import apply_overrides, get_config
from tierax.plan.presets import load_plan
from tierax.xla.compile import compile_for_target
out = {}
for layers in (1, 2):
    cfg = apply_overrides(get_config("tiny-llama"), [f"num_layers={layers}", "d_model=128",
        "mlp_dim=256", "num_heads=2", "num_kv_heads=2", "head_dim=64", "vocab_size=256",
        "attention=xla"])
    for name in ("save-all", "remat-full"):
        _, text = compile_for_target(cfg, load_plan(name, cfg), "v5e", microbatch=2, seq=128)
        out[f"{layers}:{name}"] = sum(
            bool(re.search(r"= \S+ (dot|convolution)\(", ln) or "kind=kOutput" in ln)
            for ln in text.split("\n")
        )
print(json.dumps(out))
"""


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: XLA:TPU cannot compile here")
def test_remat_in_a_one_layer_group_recomputes_on_xla_tpu():
    p = subprocess.run(
        [sys.executable, "-c", _COMPILE],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    # two layers: the loop keeps the recomputation (the reference for what remat adds)
    added = got["2:remat-full"] - got["2:save-all"]
    assert added > 0, got
    # one layer: the same recomputation, not merged away
    assert got["1:remat-full"] - got["1:save-all"] == added, got


def test_single_trip_is_a_scan_of_one_trip():
    def state(n):
        return {"w": jnp.zeros((n, 3)), "b": jnp.zeros((n,))}

    assert single_trip(state(1), 1)
    assert not single_trip(state(2), 1)
    assert single_trip(state(2), 2)  # two layers unrolled in one trip
    assert not single_trip(state(4), 2)
    assert single_trip(jax.eval_shape(lambda: state(1)), 1)  # abstract state, as when tracing
