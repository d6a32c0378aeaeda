"""bench/gemm_shapes.py lists a step's GEMMs from its jaxpr: checked on functions whose matmuls are
known by construction (shapes, dimension numbers, scan trip counts), and its GEMM timing against
FLOPs counted by hand."""

import pathlib
import sys

import jax
import jax.numpy as jnp
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gs():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gemm_shapes
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return gemm_shapes


def _fn(x, w, v):
    # Outside the scan: one [4, 8] x [8, 16].  Inside a 3-trip scan: [4, 16] x [16, 16] twice
    # (the same GEMM twice per trip) and one batched [2, 4, 8] x [2, 8, 5] once per trip.
    y = x @ w

    def body(c, _):
        c = jnp.tanh(c @ v) @ v
        b = jnp.einsum("bik,bkj->bij", jnp.ones((2, 4, 8)), jnp.ones((2, 8, 5)))
        return c + b.sum(), None

    out, _ = jax.lax.scan(body, y, None, length=3)
    return out.sum()


def test_step_gemms_counts_each_distinct_gemm_with_its_executions(gs):
    x, w, v = jnp.ones((4, 8)), jnp.ones((8, 16)), jnp.ones((16, 16))
    gemms = gs.step_gemms(jax.make_jaxpr(_fn)(x, w, v))
    by = {(tuple(g["lhs"]), tuple(g["rhs"])): g for g in gemms}
    assert set(by) == {((4, 8), (8, 16)), ((4, 16), (16, 16)), ((2, 4, 8), (2, 8, 5))}
    assert by[(4, 8), (8, 16)]["executions"] == 1
    assert by[(4, 16), (16, 16)]["executions"] == 6  # two per trip, 3 trips
    assert by[(2, 4, 8), (2, 8, 5)]["executions"] == 3
    assert by[(4, 8), (8, 16)]["flops"] == 2 * 4 * 8 * 16
    assert by[(4, 16), (16, 16)]["flops"] == 2 * 4 * 16 * 16
    batched = by[(2, 4, 8), (2, 8, 5)]
    assert batched["flops"] == 2 * 2 * 4 * 8 * 5
    assert batched["batch"] == [[0], [0]] and batched["contract"] == [[2], [1]]
    assert all(g["lhs_dtype"] == g["out_dtype"] == "float32" for g in gemms)


def test_step_gemms_of_a_gradient_lists_the_backward_gemms(gs):
    # d/dW sum(x @ W): the forward GEMM and the weight gradient xᵀ·dy (contracted over the rows).
    x, w = jnp.ones((6, 3)), jnp.ones((3, 5))
    gemms = gs.step_gemms(jax.make_jaxpr(jax.grad(lambda w: (x @ w).sum()))(w))
    assert sum(g["flops"] * g["executions"] for g in gemms) == 2 * (2 * 6 * 3 * 5)
    (wg,) = [g for g in gemms if g["contract"] == [[0], [0]]]
    # Timed in XLA:CPU's step form at (M tokens, K, N) = (6, 3, 5), whichever operand JAX put first.
    assert sorted(gs.weight_gradient_mkn(wg)) == [3, 5, 6] and gs.weight_gradient_mkn(wg)[0] == 6
    assert [gs.weight_gradient_mkn(g) for g in gemms if g is not wg] == [None]
    # Batched (an expert's) and bfloat16 weight gradients are timed as written.
    batched = {**wg, "lhs": [2, 6, 3], "rhs": [2, 6, 5], "contract": [[1], [1]]}
    batched["batch"] = [[0], [0]]
    assert gs.weight_gradient_mkn(batched) is None
    assert gs.weight_gradient_mkn({**wg, "lhs_dtype": "bfloat16"}) is None


def test_time_gemms_reports_each_gemms_rate_from_its_own_time(gs):
    a, b = jnp.ones((64, 32)), jnp.ones((32, 48))
    gemms = gs.step_gemms(jax.make_jaxpr(lambda a, b: a @ b)(a, b))
    gs.time_gemms(gemms, rounds=3, touch=None)
    (g,) = gemms
    assert len(g["times_s"]) == 3 and g["net_s"] == g["raw_s"] > 0
    assert g["flops_per_s"] == pytest.approx(2 * 64 * 32 * 48 / g["net_s"])
