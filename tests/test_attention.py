"""Blockwise (flash-style) attention equals the materialised XLA form, values and gradients."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tierax import plan as plan_lib
from tierax.models import get_config
from tierax.models.attention import causal_attention
from tierax.tracing import jaxpr_tools
from tierax.train import step as S


def _qkv(B, T, K, G, d, dv, seed=0):
    # standard normal float32 drawn by NumPy (jax.random compiles a program for every shape)
    rng = np.random.default_rng(seed)
    return tuple(
        jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
        for shape in ((B, T, K, G, d), (B, T, K, d), (B, T, K, dv), (B, T, K, G, dv))
    )


# (G query heads per kv head, requested block, d, dv, unroll) at T = 32: nq = 4, 2, 1, 4 (a
# block of 12 falls to 8, the largest divisor), 8 and 2; the last two MLA-like (dv != d).
@pytest.mark.parametrize(
    "groups, block, d, dv, unroll",
    [
        (1, 8, 16, 8, False),
        (2, 16, 16, 8, False),
        (3, 32, 16, 8, False),
        (2, 12, 16, 8, False),
        (2, 4, 24, 16, False),
        (1, 16, 24, 16, True),
    ],
)
def test_blockwise_matches_xla(groups, block, d, dv, unroll):
    q, k, v, ct = _qkv(2, 32, 2, groups, d, dv)

    def f(impl):
        kw = {"block": block, "unroll": unroll} if impl == "blockwise" else {}
        return lambda q, k, v: jnp.sum(causal_attention(q, k, v, impl=impl, **kw) * ct)

    out = causal_attention(q, k, v, impl="blockwise", block=block, unroll=unroll)
    np.testing.assert_allclose(out, causal_attention(q, k, v, impl="xla"), rtol=1e-5, atol=1e-5)
    g_ref = jax.grad(f("xla"), argnums=(0, 1, 2))(q, k, v)
    g_blk = jax.grad(f("blockwise"), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_blk, g_ref, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_blockwise_is_self_attention_only():
    q, k, v, _ = _qkv(1, 32, 1, 1, 8, 8)
    with pytest.raises(ValueError, match="S=16 and T=32"):
        causal_attention(q[:, :16], k, v, impl="blockwise", block=8)


def _pairs_flops(B, T, K, G, d, dv, block):
    """Matmul FLOPs of blockwise forward + backward from the shapes: per (query block, key
    block) pair, the forward's scores and context (2·blk²·(d + dv) per head) and the backward's
    recomputed scores, dp, dv, dq and dk (2·blk²·(3d + 2dv)); nq·(nq+1)/2 pairs of the nq²."""
    nq = T // block
    per_pair = 2 * B * K * G * block * block * (4 * d + 3 * dv)
    return per_pair * nq * (nq + 1) // 2, per_pair * nq * nq


@pytest.mark.parametrize(
    "T, K, G, d, dv, block",
    [
        (256, 1, 2, 64, 64, 64),
        (256, 2, 1, 24, 16, 32),
        (256, 1, 2, 64, 64, 256),
    ],
)
def test_jaxpr_matmul_flops_count_only_the_visible_blocks(T, K, G, d, dv, block):
    """tierax's jaxpr counter (the inventory's recompute FLOPs) multiplies the pair scan's body
    by its length: exactly the skipped count, forward and custom backward together."""
    B = 1
    shapes = [(B, T, K, G, d), (B, T, K, d), (B, T, K, dv), (B, T, K, G, dv)]

    def fwd_bwd(q, k, v, ct):
        out, vjp = jax.vjp(
            lambda q, k, v: causal_attention(q, k, v, impl="blockwise", block=block), q, k, v
        )
        return out, vjp(ct)

    jaxpr = jax.make_jaxpr(fwd_bwd)(*(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes))
    skipped, _ = _pairs_flops(B, T, K, G, d, dv, block)
    assert jaxpr_tools.matmul_flops(jaxpr) == skipped


def _xla_flops(compiled) -> float:
    cost = compiled.cost_analysis()  # a dict, or a list of one dict on some jax versions
    return (cost[0] if isinstance(cost, list) else cost)["flops"]


def _compiled_fwd_bwd_flops(impl, q, k, v, ct, **kw) -> float:
    """XLA's FLOPs of the forward plus those of the backward, compiled apart: compiled together,
    XLA merges the forward's score matmul with the backward's identical recomputation, which a
    scanned backward cannot do."""

    def f(q, k, v):
        return causal_attention(q, k, v, impl=impl, **kw)

    _, vjp = jax.vjp(f, q, k, v)
    fwd = _xla_flops(jax.jit(f).lower(q, k, v).compile())
    return fwd + _xla_flops(jax.jit(lambda vjp, ct: vjp(ct)).lower(vjp, ct).compile())


@pytest.mark.parametrize("block", [64, 256])
def test_compiled_flops_skip_the_masked_blocks(block):
    """XLA's own FLOP count, loops unrolled (its cost analysis counts a loop body once): blockwise
    forward + backward does (nq+1)/(2·nq) of the unskipped matmul work.  The xla form's count,
    against its hand count 2·B·H·S·T·3·(d + dv), anchors what XLA counts (elementwise work on
    top: within a few percent at d = dv = 64)."""
    B, T, K, G, d, dv = 1, 256, 1, 2, 64, 64
    nq = T // block
    q, k, v, ct = _qkv(B, T, K, G, d, dv)
    xla = _compiled_fwd_bwd_flops("xla", q, k, v, ct)
    assert 1.0 <= xla / (2 * B * K * G * T * T * 3 * (d + dv)) < 1.04
    blk = _compiled_fwd_bwd_flops("blockwise", q, k, v, ct, block=block, unroll=True)
    skipped, full = _pairs_flops(B, T, K, G, d, dv, block)
    assert skipped * 2 * nq == full * (nq + 1)
    assert 1.0 <= blk / skipped < 1.04
    # Against XLA's count of the xla form: the pair fraction times the backward's recompute.
    expected = (nq + 1) / (2 * nq) * (4 * d + 3 * dv) / (3 * d + 3 * dv)
    assert blk / xla == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize(
    "name", ["tiny-llama", pytest.param("tiny-deepseek", marks=pytest.mark.slow)]  # MoE: 20 s
)
def test_models_with_blockwise_attention_match(name):
    base = get_config(name)
    blk = dataclasses.replace(base, attention="blockwise", attention_block=16)
    graphdef, params = S.init_params(base, seed=4)
    tokens = S.synthetic_batch(base, 2, 32, seed=5)
    l0, g0 = S.loss_and_grads(graphdef, base, plan_lib.preset("save-all", base), params, tokens)
    graphdef_b, _ = S.init_params(blk, seed=4)
    l1, g1 = S.loss_and_grads(graphdef_b, blk, plan_lib.preset("qkv-offload", blk), params, tokens)
    assert abs(float(l1) - float(l0)) <= 1e-5 * abs(float(l0))
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=False):
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


def test_rematerialised_layers_keep_no_stack_of_block_masks():
    """Under remat, each block's causal mask is made where it is used: no boolean [..., blk, blk]
    array larger than one block anywhere in the step.  Built from the block indices alone, the
    masks were computed ahead of the layer scan for every visible block pair and kept through the
    step (on XLA:TPU a 22 GiB stack per device at Llama 3 8B, 11 × 8192 tokens, v5p)."""
    from flax import nnx
    from jax.extend.core import jaxprs_in_params

    from tierax.models import abstract_model

    B, seq, block = 3, 1024, 128
    cfg = dataclasses.replace(
        get_config("llama3-8b"),
        num_layers=2,
        d_model=256,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        mlp_dim=512,
        vocab_size=1000,
        attention="blockwise",
        attention_block=block,
    )
    graphdef, params = nnx.split(abstract_model(cfg))
    loss = S.make_loss_fn(graphdef, plan_lib.to_policies(plan_lib.preset("remat-full", cfg), cfg))
    tokens = jax.ShapeDtypeStruct((B, seq + 1), jnp.int32)
    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss))(params, tokens)

    def biggest_mask(j):
        sizes = [
            v.aval.size
            for e in j.eqns
            for v in e.outvars
            if getattr(v.aval, "dtype", None) == jnp.bool_ and v.aval.shape[-2:] == (block, block)
        ]
        for e in j.eqns:
            sizes += [biggest_mask(getattr(s, "jaxpr", s)) for s in jaxprs_in_params(e.params)]
        return max(sizes, default=0)

    one_block = B * cfg.num_kv_heads * (cfg.num_heads // cfg.num_kv_heads) * block * block
    assert 0 < biggest_mask(jaxpr.jaxpr) <= one_block
