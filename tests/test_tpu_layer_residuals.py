"""One recomputed layer's residuals as XLA:TPU holds them in its backward (the cost model's TPU
workspace): JAX's residuals less those made by cheap elementwise operations (XLA:TPU fuses them
into their consumers, matmul operands included), the values those fusions read written instead.
Hand counts on CPU; the check against XLA:TPU's own compile is the slow test at the end."""

import importlib.util

import jax
import jax.numpy as jnp
import pytest

from tierax import costmodel as cm
from tierax.costmodel import fixed
from tierax.models import get_config
from tierax.models import moe as moe_lib
from tierax.tracing import hbm
from tierax.tracing import inventory as inv_lib
from tierax.tracing.model_program import for_inventory

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
T, D, F = 96, 32, 80  # tokens, model width, hidden width (distinct: no shape is mistaken)


def _swiglu(x, p):
    a, b = x @ p["w0"], x @ p["w1"]
    return x + (jax.nn.silu(a) * b) @ p["wo"]


PARAMS = {
    "w0": jax.ShapeDtypeStruct((D, F), jnp.float32),
    "w1": jax.ShapeDtypeStruct((D, F), jnp.float32),
    "wo": jax.ShapeDtypeStruct((F, D), jnp.float32),
}
X = jax.ShapeDtypeStruct((T, D), jnp.float32)


def test_swiglu_residuals_written_are_the_input_and_the_two_gemm_outputs():
    total, written = hbm.written_residual_bytes(_swiglu, X, PARAMS)
    # By hand: the backward needs x (dW0, dW1), a and b (GEMM outputs: the SwiGLU derivative) and
    # σ(a) (expensive: not duplicated) — written; silu(a) = a·σ(a) and silu(a)·b (dWo's operand)
    # are cheap products of them, fused.
    assert written == 4 * (T * D + 3 * T * F)
    assert total - written >= 4 * T * F  # silu(a)·b at least


def test_a_matmul_output_behind_a_reshape_or_a_jit_is_written():
    def layer(x, p):
        h = jax.jit(lambda u, w: (u @ w).reshape(T, F // 2, 2))(x, p["w0"])
        return x + (h * h).reshape(T, F) @ p["wo"]

    params = {"w0": PARAMS["w0"], "wo": PARAMS["wo"]}
    total, written = hbm.written_residual_bytes(layer, X, params)
    # JAX keeps x, h (the square's derivative 2h) and h·h (dWo's operand); the square is cheap,
    # fused into its consumers, which read h = x·W0 (through the jit and the reshapes): x and h
    # written, each once.
    assert written == 4 * (T * D + T * F)
    assert total - written >= 4 * T * F


def test_a_softmax_writes_its_exp():
    def layer(x, p):
        s = x @ p["w0"]
        e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
        return x + (e / jnp.sum(e, axis=-1, keepdims=True)) @ p["wo"]

    params = {"w0": PARAMS["w0"], "wo": PARAMS["wo"]}
    _, written = hbm.written_residual_bytes(layer, X, params)
    # exp and the division are expensive (XLA does not duplicate them): e and the probabilities
    # are written; so is s = x·W0, which the max's derivative (where s equals its row's max) reads;
    # and x, and three per-row values (the max, the sum, its reciprocal square for the quotient).
    assert written == 4 * (T * D + 3 * T * F + 3 * T)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-mixtral"])
def test_the_tpu_workspace_holds_the_written_residuals(model):
    cfg = get_config(model)
    mb, seq = 2, 32
    inv = inv_lib.model_inventory(cfg, mb, seq, {"fsdp": 1})
    (g,) = inv.groups
    assert 0 < g.written_residual_bytes_per_layer < g.save_all_bytes_per_layer
    tpu = fixed.fixed_terms(for_inventory(cfg, inv), cm.target_rates("v6e", cfg.dtype), "lhs")
    gpu = fixed.fixed_terms(for_inventory(cfg, inv), cm.target_rates("h200", cfg.dtype), "lhs")
    moe = moe_lib.backward_buffer_bytes(cfg, mb * seq, 1) if cfg.num_experts else 0
    # One device, no FSDP: the workspace is the layer's residuals (and a MoE layer's dispatch-sized
    # backward buffers); XLA:GPU writes them all, XLA:TPU those it cannot fuse away.
    assert gpu.workspace_bytes == g.save_all_bytes_per_layer + moe
    assert tpu.workspace_bytes == g.written_residual_bytes_per_layer + moe


def test_the_planners_extrapolated_inventory_carries_the_written_residuals():
    """The microbatch search extrapolates the inventory from microbatches 1 and 2: the written
    residuals are linear in the microbatch (the RoPE tables a constant part), as traced at 3."""
    from tierax.solving import planner

    cfg = get_config("tiny-llama")
    one, two, three = (inv_lib.model_inventory(cfg, m, 32) for m in (1, 2, 3))
    got = planner._scaled(one, two, 3).groups[0].written_residual_bytes_per_layer
    want = three.groups[0].written_residual_bytes_per_layer
    assert got == want > one.groups[0].written_residual_bytes_per_layer
