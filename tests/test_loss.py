"""The loss: tiled cross-entropy against the untiled and textbook forms (values, gradients, the
largest array it holds), its hand-written backward in bfloat16, and the tile count check."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params

from tierax.errors import TieraxError
from tierax.mesh import MeshShape
from tierax.models import get_config
from tierax.models import loss as loss_lib


def _normal(rng, shape):
    """Standard normal float32 drawn by NumPy (jax.random compiles a program for every shape)."""
    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32))


def _assert_close(a_tree, b_tree, rel=1e-5):
    for a, b in zip(jax.tree.leaves(a_tree), jax.tree.leaves(b_tree), strict=True):
        a, b = np.asarray(a), np.asarray(b)  # different device sets: compare on the host
        assert np.max(np.abs(a - b)) <= rel * np.max(np.abs(b)) + 1e-8


def _eqns(jaxpr):
    """Every equation of a jaxpr, sub-jaxprs included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jaxprs_in_params(eqn.params):
            yield from _eqns(sub)


def _max_float_elements(closed):
    """Elements of the largest float array any equation of a jaxpr (sub-jaxprs included)
    produces."""
    sizes = [
        int(np.prod(v.aval.shape))
        for eqn in _eqns(closed.jaxpr)
        for v in eqn.outvars
        if hasattr(v.aval, "shape") and jnp.issubdtype(v.aval.dtype, jnp.floating)
    ]
    return max(sizes, default=0)


def test_tiled_loss_equals_untiled_and_never_holds_full_logits():
    B, S_, D, V = 4, 32, 16, 512
    rng = np.random.default_rng(0)
    h = _normal(rng, (B, S_, D))
    w = _normal(rng, (D, V)) * D**-0.5
    t = jnp.asarray(rng.integers(0, V, (B, S_)), jnp.int32)

    def grad_fn(tiles):
        return jax.value_and_grad(
            lambda h, w: loss_lib.cross_entropy(h, w, t, tiles=tiles), argnums=(0, 1)
        )

    ref = jax.jit(grad_fn(1))(h, w)
    logp = jax.nn.log_softmax(h @ w, -1)  # the textbook form
    assert float(ref[0]) == pytest.approx(
        float(-jnp.mean(jnp.take_along_axis(logp, t[..., None], -1))), rel=1e-6
    )
    for tiles in (2, 8):
        _assert_close(jax.jit(grad_fn(tiles))(h, w), ref)
        # Neither the forward nor the backward has a [B, S, V] array: at most one chunk's logits.
        assert _max_float_elements(jax.make_jaxpr(grad_fn(tiles))(h, w)) == B * (S_ // tiles) * V
    assert _max_float_elements(jax.make_jaxpr(grad_fn(1))(h, w)) == B * S_ * V


@pytest.mark.parametrize("tiles", [1, 4])
def test_loss_gradient_equals_autodiff_of_the_textbook_form(tiles):
    """The loss's hand-written backward (softmax · g, then −g scattered at the targets) against
    jax.grad of −mean(log_softmax[target]), on one device and with the batch split over 8."""
    B, S_, D, V = 8, 16, 16, 384
    rng = np.random.default_rng(1)
    h = _normal(rng, (B, S_, D))
    w = _normal(rng, (D, V)) * D**-0.5
    t = jnp.asarray(rng.integers(0, V, (B, S_)), jnp.int32)
    t = (
        t.at[0, :4].set(V - 1).at[1, :4].set(0)
    )  # the vocabulary's first and last entries as targets

    def textbook(h, w):
        logp = jax.nn.log_softmax(h @ w, -1)
        return -jnp.mean(jnp.take_along_axis(logp, t[..., None], -1))

    ref = jax.value_and_grad(textbook, argnums=(0, 1))(h, w)
    got = jax.jit(
        jax.value_and_grad(
            lambda h, w: loss_lib.cross_entropy(h, w, t, tiles=tiles), argnums=(0, 1)
        )
    )(h, w)
    _assert_close(got, ref)
    mesh = MeshShape(data=2, fsdp=4).make()
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp", "expert")))
    hs, ts = jax.device_put(h, split), jax.device_put(t, split)
    got = jax.jit(
        jax.value_and_grad(
            lambda h, w: loss_lib.cross_entropy(h, w, ts, tiles=tiles, mesh=mesh), argnums=(0, 1)
        )
    )(hs, w)
    _assert_close(got, ref)


def test_bfloat16_loss_backward_multiplies_in_bfloat16():
    """In a bfloat16 step the head's two backward matmuls take bfloat16 operands (float32 logits,
    float32
    accumulation), and the gradients stay within bfloat16 rounding of the float32 textbook form."""
    B, S_, D, V = 4, 16, 32, 512
    rng = np.random.default_rng(2)
    h = _normal(rng, (B, S_, D)).astype(jnp.bfloat16)
    w = (_normal(rng, (D, V)) * D**-0.5).astype(jnp.bfloat16)
    t = jnp.asarray(rng.integers(0, V, (B, S_)), jnp.int32)

    def textbook(h, w):  # float32 throughout, from the same bfloat16 inputs
        logp = jax.nn.log_softmax(h.astype(jnp.float32) @ w.astype(jnp.float32), -1)
        return -jnp.mean(jnp.take_along_axis(logp, t[..., None], -1))

    ref_loss, ref_grads = jax.value_and_grad(textbook, argnums=(0, 1))(h, w)
    for tiles in (1, 4):
        fn = jax.value_and_grad(
            lambda h, w, tiles=tiles: loss_lib.cross_entropy(h, w, t, tiles=tiles), argnums=(0, 1)
        )
        loss, grads = jax.jit(fn)(h, w)
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)  # the logits are float32
        for g, r in zip(grads, ref_grads, strict=True):
            assert g.dtype == jnp.bfloat16
            g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
            assert np.abs(g - r).max() <= 2e-2 * np.abs(r).max()

        dots = [
            tuple(str(v.aval.dtype) for v in eqn.invars)
            for eqn in _eqns(jax.make_jaxpr(fn)(h, w).jaxpr)
            if eqn.primitive.name == "dot_general"
        ]
        assert len(dots) >= 3 and all(d == ("bfloat16", "bfloat16") for d in dots), dots


def test_tpu_loss_takes_compute_dtype_logits_and_matches_its_textbook_form():
    """On TPU (``platform="tpu"``) the head's matmul outputs bfloat16 logits (MaxText's default
    numerics): the loss is the textbook loss of those rounded logits, not of float32 ones, and the
    gradients stay within bfloat16 rounding of that form's autodiff."""
    B, S_, D, V = 4, 16, 32, 512
    rng = np.random.default_rng(3)
    h = _normal(rng, (B, S_, D)).astype(jnp.bfloat16)
    # logits of a few units
    w = (_normal(rng, (D, V)) * D**-0.5 * 8).astype(jnp.bfloat16)
    t = jnp.asarray(rng.integers(0, V, (B, S_)), jnp.int32)

    def textbook(h, w, dtype):
        logits = jnp.einsum("bsd,dv->bsv", h, w, preferred_element_type=dtype).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.mean(jnp.take_along_axis(logp, t[..., None], -1))

    ref_loss, ref_grads = jax.value_and_grad(textbook, argnums=(0, 1))(h, w, jnp.bfloat16)
    f32_loss = textbook(h, w, jnp.float32)
    # the rounding shows
    assert abs(float(ref_loss) - float(f32_loss)) > 1e-5 * abs(float(f32_loss))
    for tiles in (1, 4):
        fn = jax.value_and_grad(
            lambda h, w, tiles=tiles: loss_lib.cross_entropy(h, w, t, tiles=tiles, platform="tpu"),
            argnums=(0, 1),
        )
        loss, grads = jax.jit(fn)(h, w)
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
        for g, r in zip(grads, ref_grads, strict=True):
            g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
            assert np.abs(g - r).max() <= 2e-2 * np.abs(r).max()
        heads = [
            e.outvars[0].aval.dtype
            for e in _eqns(jax.make_jaxpr(fn)(h, w).jaxpr)
            if e.primitive.name == "dot_general" and e.outvars[0].aval.shape[1:] == (S_ // tiles, V)
        ]
        # the logits come out in bfloat16
        assert heads and all(d == jnp.bfloat16 for d in heads), heads
    # Elsewhere the logits stay float32 (tests above): the GPU and CPU steps are unchanged.
    assert loss_lib.logits_dtype(jnp.bfloat16, "gpu") == jnp.float32
    assert loss_lib.logits_dtype(jnp.bfloat16, "tpu") == jnp.bfloat16


def test_loss_tiles_must_divide_the_sequence():
    with pytest.raises(
        TieraxError, match=r"loss_tiles=5 does not divide the sequence length 32.*loss_tiles=4"
    ):
        loss_lib.check_tiles(5, 32)
    with pytest.raises(TieraxError, match="loss_tiles must be an integer ≥ 1"):
        dataclasses.replace(get_config("tiny-llama"), loss_tiles=0)
