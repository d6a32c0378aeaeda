"""The splash kernel's log-sum-exp buffer, held by the stand-in the cost model traces.

The splash forward writes its log-sum-exp as float32 [heads, seq, 128] (the value repeated across
a vector register's lanes; its wrapper slices one lane for the backward).  A layer backward that
recomputes the attention holds that buffer: at head count 16 and seq 2048 it is 16 MiB a sequence,
which the model's per-sequence slope lacked beside XLA:TPU's compile of the chip check's dense
case, so it put remat-full at microbatch 26 under the chip's limit where XLA:TPU refuses it
(bench/results/chip/tpu_check_boundary.json).  The host stand-in (``splash_blockwise``) writes the
same buffer (tierax.models.attention.SPLASH_LSE_LANES)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.extend.core import jaxprs_in_params

from tierax.models.attention import causal_attention

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


def _float32_outputs(impl: str, primitive: str, shapes) -> list[tuple]:
    """Shapes of the float32 outputs of every ``primitive`` equation in the gradient's jaxpr."""

    def loss(q, k, v):
        return causal_attention(q, k, v, impl=impl).astype(jnp.float32).sum()

    jaxpr = jax.make_jaxpr(jax.grad(loss))(*shapes).jaxpr
    found = []

    def walk(j):
        for e in j.eqns:
            if e.primitive.name == primitive:
                found.extend(o.aval.shape for o in e.outvars if o.aval.dtype == jnp.float32)
            for sub in jaxprs_in_params(e.params):
                walk(sub)

    walk(jaxpr)
    return found


def test_the_stand_in_writes_the_log_sum_exp_buffer_the_splash_kernel_writes():
    # head dim 64, so no [..., 128] buffer of the stand-in's output or accumulator can pass for it
    B, S, K, G, D = 2, 256, 2, 3, 64
    q = jax.ShapeDtypeStruct((B, S, K, G, D), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((B, S, K, D), jnp.bfloat16)
    # The real kernel (Pallas's splash attention, traced, not run): its float32 outputs
    kernel = _float32_outputs("splash", "pallas_call", (q, kv, kv))
    assert kernel == [(B, K * G, S, 128)], kernel  # one: the forward's log-sum-exp
    # The stand-in's forward scan writes a buffer of the same elements, [B, K, G, S, 128]
    stand_in = _float32_outputs("splash_blockwise", "scan", (q, kv, kv))
    wide = [s for s in stand_in if s[-2:] == (S, 128)]
    assert wide and all(math.prod(s) == math.prod(kernel[0]) for s in wide), stand_in


def test_the_stand_in_is_exact_with_the_wide_log_sum_exp():
    keys = jax.random.split(jax.random.key(0), 4)
    B, S, K, G, D = 1, 256, 2, 2, 64
    q = jax.random.normal(keys[0], (B, S, K, G, D), jnp.float32)
    k = jax.random.normal(keys[1], (B, S, K, D), jnp.float32)
    v = jax.random.normal(keys[2], (B, S, K, D), jnp.float32)
    w = jax.random.normal(keys[3], (B, S, K, G, D), jnp.float32)

    def loss(impl):
        return lambda q, k, v: (causal_attention(q, k, v, impl=impl) * w).sum()

    ref = jax.value_and_grad(loss("xla"), argnums=(0, 1, 2))(q, k, v)
    got = jax.value_and_grad(loss("splash_blockwise"), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
        assert jnp.allclose(a, b, atol=2e-4, rtol=2e-4)


# The chip check's dense case (tests nothing else compiles it at this size): XLA:TPU's deviceless
# compile at the microbatches either side of the chip's boundary (25 ran on the chip, 26 was
# refused), beside the model's verdict.
_BOUNDARY = r"""
import json
from tierax import launch
launch.start_deviceless_tpu(accelerator_type="v5litepod-1")
from tierax import costmodel as cm
from tierax.models import apply_overrides, for_platform, get_config
from tierax.plan.presets import load_plan
from tierax.tracing.model_program import program_of
from tierax.xla.compile import compile_for_target
cfg = for_platform(apply_overrides(get_config("tiny-llama"), ["d_model=2048", "num_layers=8",
    "mlp_dim=8192", "num_heads=16", "num_kv_heads=8", "head_dim=128", "vocab_size=32000",
    "dtype=bfloat16", "attention=auto"]), "tpu")
rates = cm.target_rates("v5e", cfg.dtype, calibration={})
plan = load_plan("remat-full", cfg)
out = {}
for mb in (25, 26):
    res, _ = compile_for_target(cfg, plan, "v5e", microbatch=mb, seq=2048)
    pred = cm.simulate(plan, program_of(cfg, mb, 2048, {"data": 1, "fsdp": 1}), rates, "lhs", 1)
    out[mb] = {"xla_fits": res.fits, "model_fits": pred.fits}
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: XLA:TPU cannot compile here")
def test_the_fit_boundary_of_the_chip_checks_dense_case_is_xla_tpus():
    p = subprocess.run(
        [sys.executable, "-c", _BOUNDARY],
        capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["25"] == {"xla_fits": True, "model_fits": True}, got
    assert got["26"] == {"xla_fits": False, "model_fits": False}, got
