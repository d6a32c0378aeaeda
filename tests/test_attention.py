"""Blockwise (flash-style) attention equals the materialised XLA form, values and gradients."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tierax import plan as P
from tierax.models import get_config
from tierax.models.attention import causal_attention
from tierax.train import step as S


@pytest.mark.parametrize("groups, block", [(1, 8), (2, 16), (3, 32), (2, 12)])
def test_blockwise_matches_xla(groups, block):
    k0, k1, k2, k3 = jax.random.split(jax.random.key(0), 4)
    B, T, K, d, dv = 2, 32, 2, 16, 8
    q = jax.random.normal(k0, (B, T, K, groups, d))
    k = jax.random.normal(k1, (B, T, K, d))
    v = jax.random.normal(k2, (B, T, K, dv))
    ct = jax.random.normal(k3, (B, T, K, groups, dv))

    def f(impl):
        return lambda q, k, v: jnp.sum(causal_attention(q, k, v, impl=impl, block=block) * ct)

    np.testing.assert_allclose(causal_attention(q, k, v, impl="blockwise", block=block),
                               causal_attention(q, k, v, impl="xla"), rtol=1e-5, atol=1e-5)
    g_ref = jax.grad(f("xla"), argnums=(0, 1, 2))(q, k, v)
    g_blk = jax.grad(f("blockwise"), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_blk, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-deepseek"])
def test_models_with_blockwise_attention_match(name):
    base = get_config(name)
    blk = dataclasses.replace(base, attention="blockwise", attention_block=16)
    graphdef, params = S.init_params(base, seed=4)
    tokens = S.synthetic_batch(base, 2, 32, seed=5)
    l0, g0 = S.loss_and_grads(graphdef, base, P.preset("save-all", base), params, tokens)
    graphdef_b, _ = S.init_params(blk, seed=4)
    l1, g1 = S.loss_and_grads(graphdef_b, blk, P.preset("qkv-offload", blk), params, tokens)
    assert abs(float(l1) - float(l0)) <= 1e-5 * abs(float(l0))
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-4 * float(jnp.max(jnp.abs(b))) + 1e-7


def test_blockwise_never_materialises_scores():
    B, T, K, d = 1, 1024, 1, 16
    q = jax.ShapeDtypeStruct((B, T, K, 1, d), jnp.float32)
    kv = jax.ShapeDtypeStruct((B, T, K, d), jnp.float32)
    loss = lambda q, k, v: jnp.sum(causal_attention(q, k, v, impl="blockwise", block=128))  # noqa: E731
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, kv, kv)
    biggest = max(v.aval.size for e in jaxpr.eqns for v in e.outvars if hasattr(v.aval, "size"))
    assert biggest < T * T  # no T×T array at the top level


def test_blockwise_holds_one_score_block_at_a_time():
    """Queries are blocked too: no array (nested loops included) of a query length × key block."""
    from jax.extend.core import jaxprs_in_params

    B, T, K, d, block = 1, 1024, 1, 16, 128
    q = jax.ShapeDtypeStruct((B, T, K, 1, d), jnp.float32)
    kv = jax.ShapeDtypeStruct((B, T, K, d), jnp.float32)
    loss = lambda q, k, v: jnp.sum(causal_attention(q, k, v, impl="blockwise", block=block))  # noqa: E731
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, kv, kv)

    def biggest(j):
        sizes = [v.aval.size for e in j.eqns for v in e.outvars if hasattr(v.aval, "size")]
        sizes += [biggest(sub) for e in j.eqns for sub in jaxprs_in_params(e.params)]
        return max(sizes, default=0)

    assert biggest(jaxpr.jaxpr) <= max(block * block, T * d)  # < T × block (the key-only blocking)
