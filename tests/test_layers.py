"""SwiGLU's gate (``tierax.models.layers.swiglu_gate``): its hand-written backward pass."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from tierax.models.layers import swiglu_gate


def _textbook(g, u):  # JAX differentiates this one itself
    return g / (1 + jnp.exp(-g)) * u


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-6), ("bfloat16", 2e-2)])
def test_gate_gradient_matches_autodiff(dtype, tol):
    kg, ku, ky = jax.random.split(jax.random.key(0), 3)
    shape = (3, 5, 64)
    g = (3 * jax.random.normal(kg, shape)).astype(
        dtype
    )  # wide enough to reach both tails of the sigmoid
    u = jax.random.normal(ku, shape).astype(dtype)
    dy = jax.random.normal(ky, shape).astype(dtype)
    y, vjp = jax.vjp(swiglu_gate, g, u)
    y_ref, vjp_ref = jax.vjp(_textbook, g, u)
    np.testing.assert_allclose(
        np.asarray(y, np.float32), np.asarray(y_ref, np.float32), rtol=tol, atol=tol
    )
    for got, want in zip(vjp(dy), vjp_ref(dy), strict=True):
        assert got.dtype == want.dtype == jnp.dtype(dtype)
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        assert np.abs(got - want).max() <= tol * np.abs(want).max()


def test_each_gate_gradient_has_its_own_barrier():
    """The backward pass holds one optimization barrier per gradient (a joint one keeps both live
    together)."""
    g = u = jnp.ones((4, 8), jnp.float32)
    _, vjp = jax.vjp(swiglu_gate, g, u)
    jaxpr = jax.make_jaxpr(vjp)(jnp.ones((4, 8), jnp.float32))

    def barriers(jx):
        for eqn in jx.eqns:
            if eqn.primitive.name == "optimization_barrier":
                yield eqn
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                yield from barriers(sub)

    found = list(barriers(jaxpr.jaxpr))
    assert [len(e.invars) for e in found] == [1, 1]
    # and the barriers hold the two gradients the vjp returns
    outs = {id(v) for e in found for v in e.outvars}
    assert all(id(v) in outs for v in jaxpr.jaxpr.outvars)
