"""The step with a plan's master weights in host memory (tierax.train.masters, tierax.train.
streamed): the float32 masters of the kernels live in ``pinned_host`` arrays between steps, the
loss runs on a bfloat16 copy on the device, and on CPU (where the placement is a no-op for memory)
the parameters and moments come out bit-identical to the device-only step's (with a gradient clip,
within 4 float32 ulps: :func:`assert_same`)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ulps import assert_within_ulps

from tierax import plan as P
from tierax.models import get_config
from tierax.train import masters as M
from tierax.train import step as S


def bf16(name: str):
    """The tiny model computing in bfloat16 with float32 masters (the tiny configs compute in
    float32, where a compute copy would equal its master)."""
    return dataclasses.replace(get_config(name), dtype="bfloat16", param_dtype="float32")


def run(cfg, plan, n, *, grad_clip=None, grad_accum=1):
    opt = S.make_optimizer(3e-3, grad_clip=grad_clip)
    graphdef, state = S.init_state(cfg, opt, seed=0, plan=plan)
    fn = S.make_train_step(
        graphdef,
        cfg,
        plan,
        opt,
        S.shardings_of(state),
        grad_clip=grad_clip,
        grad_accum=grad_accum,
    )
    tokens = S.synthetic_batch(cfg, 8, 16, seed=3)
    if grad_accum > 1:
        tokens = tokens.reshape(grad_accum, 8 // grad_accum, 17)
    for _ in range(n):
        state, _ = fn(state, tokens)
    return state


def assert_same(ref, got, *, clipped: bool = False):
    """Masters, moments and step count bit for bit (``got`` also carries compute copies).

    ``clipped``: a global-norm clip scaled the updates.  The streamed update takes the norm of the
    same gradients summed in another order than the whole-tree update (jax 0.12's XLA:CPU fuses
    the two differently), so from the second step the clip's scale may differ in its last bit:
    then every leaf agrees within 4 float32 ulps of its largest magnitude, not bit for bit."""
    for a, b in zip(
        jax.tree.leaves((ref.params, ref.opt_state, ref.step)),
        jax.tree.leaves((got.params, got.opt_state, got.step)),
        strict=True,
    ):
        if clipped:
            assert_within_ulps(np.asarray(b), np.asarray(a))
        else:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def kinds(params, group) -> dict:
    """Leaf name (last key) → memory kinds of ``group``'s parameters."""
    out = {}
    for path, x in jax.tree_util.tree_leaves_with_path(params):
        if P.layer_group_of(path) == group:
            out.setdefault(jax.tree_util.keystr(path[-2:-1]), set()).add(x.sharding.memory_kind)
    return out


@pytest.mark.parametrize(
    "name", ["tiny-llama", pytest.param("tiny-deepseek", marks=pytest.mark.slow)]
)
def test_gradient_wrt_the_compute_copy_is_the_masters(name):
    """The loss on the bfloat16 copies equals the loss on the float32 masters, and the gradient
    with respect to a copy, cast to float32, is the gradient with respect to its master bit for
    bit (the model's own cast's transpose is a cast).  A leaf the model uses in float32 given a
    bfloat16 copy (a norm scale, the router) would change both."""
    cfg = bf16(name)
    base = P.preset("minimal", cfg)
    plan = dataclasses.replace(base, state={g: {"master_weights": "offload"} for g in base.groups})
    graphdef, params = S.init_params(cfg)
    compute = M.derive(params, M.compute_shapes(plan, cfg, params))
    # Which leaves get a copy: every kernel and expert weight, no norm scale or router.
    last = {k.rsplit("'", 2)[-2] for k in compute}
    assert {"kernel"} <= last and not last & {"scale", "router", "embedding"}
    if name == "tiny-deepseek":
        assert {"wi_0", "wi_1", "wo"} <= last  # the routed experts' stacked weights
    assert all(v.dtype == jnp.bfloat16 for v in compute.values())
    loss = S.make_loss_fn(graphdef, P.to_policies(base, cfg))
    grad = jax.jit(jax.value_and_grad(loss))
    tokens = S.synthetic_batch(cfg, 4, 16, seed=3)
    ref_loss, ref = grad(params, tokens)
    got_loss, got = grad(M.forward_params(params, compute), tokens)
    got = M.to_master_dtypes(got, params)
    assert float(ref_loss) == float(got_loss)
    copied = 0
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(ref), jax.tree.leaves(got), strict=True
    ):
        assert a.dtype == b.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        copied += M.key_of(path) in compute
    assert copied == len(compute) > 0


@pytest.mark.parametrize(
    "kinds_, clip",
    [
        pytest.param({"master_weights": "offload"}, None, marks=pytest.mark.slow),
        # With the moments, and the two-pass clipped update (clipping: the norm is far above 0.05).
        ({"master_weights": "offload", "moments": "offload"}, 0.05),
    ],
)
def test_offloaded_masters_step_is_bit_identical(kinds_, clip):
    cfg = bf16("tiny-llama")
    base = P.preset("minimal", cfg)
    ref = run(cfg, base, 3, grad_clip=clip)
    plan = dataclasses.replace(base, state={"decoder": kinds_})
    got = run(cfg, plan, 3, grad_clip=clip)
    assert kinds(got.params, "decoder") == {
        "['kernel']": {"pinned_host"},  # the projections' float32 masters
        "['scale']": {"device"},  # the norms, used in float32, stay
    }
    moments = {x.sharding.memory_kind for x in jax.tree.leaves(got.opt_state) if x.ndim == 3}
    assert moments == {"pinned_host" if "moments" in kinds_ else "device"}
    assert_same(ref, got, clipped=clip is not None)
    # The device copy is the new masters' cast, written by the update.
    assert {v.sharding.memory_kind for v in got.compute_params.values()} == {"device"}
    for k, v in M.derive(got.params, got.compute_params).items():
        np.testing.assert_array_equal(
            np.asarray(v).view(np.uint16), np.asarray(got.compute_params[k]).view(np.uint16)
        )
    assert int(got.step) == 3


@pytest.mark.slow  # two compiles of the accumulating step, ~40 s here
def test_offloaded_masters_with_grad_accum_first_step_is_bit_identical():
    """grad_accum=2: the accumulator sums the copies' gradients in float32 and casts the mean to
    the masters' dtype, so the first update is bit-identical.  (From the second step the streamed
    update's second moment differs from the whole-tree update's in the last bit on XLA:CPU, with
    streamed moments as with streamed masters.)"""
    cfg = bf16("tiny-llama")
    base = P.preset("minimal", cfg)
    ref = run(cfg, base, 1, grad_accum=2)
    plan = dataclasses.replace(base, state={"decoder": {"master_weights": "offload"}})
    got = run(cfg, plan, 1, grad_accum=2)
    assert kinds(got.params, "decoder")["['kernel']"] == {"pinned_host"}
    assert_same(ref, got)


@pytest.mark.slow  # two layer groups (only moe's masters offloaded): a minute or more here
def test_offloaded_moe_masters_step_is_bit_identical():
    cfg = bf16("tiny-deepseek")
    base = P.preset("minimal", cfg)
    ref = run(cfg, base, 3)
    plan = dataclasses.replace(base, state={"moe": {"master_weights": "offload"}})
    got = run(cfg, plan, 3)
    moe = kinds(got.params, "moe")
    assert moe["['wi_0']"] == moe["['kernel']"] == {"pinned_host"}  # experts and projections
    assert moe["['router']"] == moe["['scale']"] == {"device"}
    assert set().union(*kinds(got.params, "dense").values()) == {"device"}
    assert_same(ref, got)
