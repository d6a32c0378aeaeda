"""Rotary position embedding (tierax.models.layers.rope): its values against complex rotation
computed with NumPy, its two forms against each other, and the TPU form against XLA:TPU's own
layout of it (a deviceless v5e compile)."""

from __future__ import annotations

import importlib.util
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tierax.models import layers

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
THETA = 10_000.0


def _by_complex(x, positions):
    """RoPE as a rotation of the complex numbers x1 + i·x2 (halves of the last axis) by the
    position times each pair's frequency, float64."""
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    freq = THETA ** (-np.arange(0, d, 2) / d)
    angle = np.asarray(positions, np.float64)[..., None, None] * freq  # [B, S, 1, d/2]
    z = (x[..., : d // 2] + 1j * x[..., d // 2 :]) * np.exp(1j * angle)
    return np.concatenate([z.real, z.imag], axis=-1)


def _x(shape=(2, 12, 3, 8), seed=0):
    # standard normal float32 drawn by NumPy (jax.random compiles a program for every shape)
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))


@pytest.mark.parametrize("documents", [False, True])
def test_rope_rotates_each_pair_by_its_position(documents):
    x = _x()
    if documents:  # packed documents: positions restart
        pos = jnp.array([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4]] * 2, jnp.int32)
    else:
        pos = jnp.broadcast_to(jnp.arange(12), (2, 12))
    got = layers.rope(x, THETA, pos if documents else None)
    np.testing.assert_allclose(np.asarray(got), _by_complex(x, pos), rtol=1e-5, atol=1e-5)
    # position 0 is the identity
    np.testing.assert_array_equal(np.asarray(got[:, 0]), np.asarray(x[:, 0]))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_both_forms_give_the_same_values_and_gradients(dtype):
    x = _x((2, 16, 4, 64), seed=1).astype(dtype)
    d = x.shape[-1]
    angle = jnp.arange(16, dtype=jnp.float32)[:, None] * (THETA ** (-jnp.arange(0, d, 2) / d))[None]
    sin, cos = jnp.sin(angle)[None, :, None], jnp.cos(angle)[None, :, None]
    halves = layers._rope_by_halves(x, sin, cos)
    perm = layers._rope_by_permutation(x, sin, cos)
    assert perm.dtype == halves.dtype == dtype
    np.testing.assert_array_equal(np.asarray(perm, np.float32), np.asarray(halves, np.float32))
    ct = _x((2, 16, 4, 64), seed=2).astype(dtype)
    g_halves = jax.vjp(lambda a: layers._rope_by_halves(a, sin, cos), x)[1](ct)[0]
    g_perm = jax.vjp(lambda a: layers._rope_by_permutation(a, sin, cos), x)[1](ct)[0]
    # the permutation's gradient rounds (ct · sin) to the input's dtype before adding
    tol = 1e-6 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(
        np.asarray(g_perm, np.float32), np.asarray(g_halves, np.float32), rtol=tol, atol=tol
    )


def _half_wide_arrays(fn, mesh, head_dim: int = 64) -> int:
    """Arrays of the compiled v5e program of ``fn`` on one [8, 2048, 16, head_dim] bfloat16 input
    whose minor dimension is half the head dim."""
    x = jax.ShapeDtypeStruct(
        (8, 2048, 16, head_dim), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec())
    )
    text = jax.jit(fn).lower(x).compile().as_text()
    pattern = rf"\w+\[8,2048,16,{head_dim // 2}\]"
    return len(re.findall(pattern, text))


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: XLA:TPU cannot compile here")
def test_the_tpu_program_holds_no_array_of_half_the_head_dim(v5e_mesh):
    def halves(x):
        d = x.shape[-1]
        freq = THETA ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
        angle = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * freq[None]
        return layers._rope_by_halves(
            x, jnp.sin(angle)[None, :, None], jnp.cos(angle)[None, :, None]
        )

    def traced_for_tpu(x):
        with layers.traced_for("tpu"):
            return layers.rope(x, THETA)

    assert _half_wide_arrays(halves, v5e_mesh) > 0  # the form XLA:TPU pads: the check sees it
    assert _half_wide_arrays(traced_for_tpu, v5e_mesh) == 0


def _permutation_dots(jaxpr, head_dim: int) -> int:
    """dot_generals of ``jaxpr`` (nested jaxprs included) whose second operand is a
    [head_dim, head_dim] matrix: the permutation form's rotation."""
    from jax.extend.core import jaxprs_in_params

    n = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general" and eqn.invars[1].aval.shape == (head_dim,) * 2:
            n += 1
        for sub in jaxprs_in_params(eqn.params):
            n += _permutation_dots(getattr(sub, "jaxpr", sub), head_dim)
    return n


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: no TPU topology here")
def test_the_train_steps_loss_takes_the_form_of_the_platform_it_is_compiled_for(v5e_mesh):
    from flax import nnx

    from tierax import plan as P
    from tierax.models import abstract_model, get_config
    from tierax.train import step as S

    cfg = get_config("tiny-llama")
    graphdef, params = nnx.split(abstract_model(cfg))
    tokens = jax.ShapeDtypeStruct((2, 33), jnp.int32)
    policies = P.to_policies(P.preset("remat-full", cfg), cfg)
    tpu, cpu = v5e_mesh, Mesh(jax.devices()[:1], ("x",))
    counts = {
        m.devices.flat[0].platform: _permutation_dots(
            jax.make_jaxpr(S.make_loss_fn(graphdef, policies, m))(params, tokens).jaxpr,
            cfg.head_dim,
        )
        for m in (tpu, cpu)
    }
    # q's and k's in the scanned layer's body (the loss: forward only); none on the CPU
    assert counts == {"tpu": 2, "cpu": 0}, counts
    # the form outside a train step's trace (the cost model's inventory): the platform-free one
    x = _x((2, 16, 4, 64))
    assert _permutation_dots(jax.make_jaxpr(lambda a: layers.rope(a, THETA))(x).jaxpr, 64) == 0
