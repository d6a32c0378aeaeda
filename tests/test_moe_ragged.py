"""``moe_impl: ragged`` — dropless grouped matmuls (``jax.lax.ragged_dot``) — against the capacity
form where the capacity drops nothing: the same routed-expert output and the same gradients, on
one device and on a 4-device fsdp mesh of the CPU backend."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tierax.errors import TieraxError
from tierax.mesh import make_mesh
from tierax.models import get_config
from tierax.models import moe as moe_lib


def _setup(capacity_factor, B=4, S=16, seed=0):
    cfg = dataclasses.replace(get_config("tiny-deepseek"), capacity_factor=capacity_factor)
    E, D, F = cfg.num_experts, cfg.d_model, cfg.expert_mlp_dim
    ks = jax.random.split(jax.random.key(seed), 6)
    x = jax.random.normal(ks[0], (B, S, D), jnp.float32)
    router = jax.random.normal(ks[1], (D, E), jnp.float32)
    wi_0 = jax.random.normal(ks[2], (E, D, F), jnp.float32) * D**-0.5
    wi_1 = jax.random.normal(ks[3], (E, D, F), jnp.float32) * D**-0.5
    wo = jax.random.normal(ks[4], (E, F, D), jnp.float32) * F**-0.5
    w = jax.random.normal(ks[5], (B, S, D), jnp.float32)
    return cfg, (x, router, wi_0, wi_1, wo), w


def _value_and_grads(cfg, args, w, mesh=None):
    def loss(x, wi_0, wi_1, wo):
        out = moe_lib.routed_experts(x, args[1], wi_0, wi_1, wo, cfg, mesh)
        return jnp.sum(out * w), out

    x, _, wi_0, wi_1, wo = args
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(
        x, wi_0, wi_1, wo
    )
    return out, grads


@pytest.mark.parametrize("devices", [1, 4])
def test_ragged_equals_the_capacity_form_when_nothing_is_dropped(devices):
    # capacity_factor = experts / k: every expert has a slot for every token, so nothing can drop.
    cfg, args, w = _setup(capacity_factor=4.0)
    assert int(moe_lib.dropped_in_batch(args[0], args[1], cfg, devices)) == 0
    mesh = make_mesh(fsdp=4, devices=jax.devices()[:4]) if devices == 4 else None
    out_c, g_c = _value_and_grads(cfg, args, w, mesh)
    out_r, g_r = _value_and_grads(dataclasses.replace(cfg, moe_impl="ragged"), args, w, mesh)
    np.testing.assert_allclose(out_r, out_c, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_r, g_c, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_ragged_is_dropless_where_the_capacity_form_drops():
    """At capacity factor 1 (a tight buffer) the capacity form drops assignments and differs from
    the dropless result; ragged does not depend on the capacity factor at all."""
    cfg, args, w = _setup(capacity_factor=1.0)
    assert int(moe_lib.dropped_in_batch(args[0], args[1], cfg)) > 0
    ragged = dataclasses.replace(cfg, moe_impl="ragged")
    out_r, _ = _value_and_grads(ragged, args, w)
    out_wide, _ = _value_and_grads(dataclasses.replace(cfg, capacity_factor=4.0), args, w)
    out_tight, _ = _value_and_grads(cfg, args, w)
    np.testing.assert_allclose(out_r, out_wide, rtol=1e-5, atol=1e-5)
    assert not np.allclose(out_tight, out_wide, rtol=1e-5, atol=1e-5)


def test_ragged_refuses_expert_parallelism_and_unknown_impls():
    cfg, args, _ = _setup(capacity_factor=4.0)
    with pytest.raises(ValueError, match="moe_impl=ragged.*no expert or tensor parallelism"):
        moe_lib.routed_experts(
            *args,
            dataclasses.replace(cfg, moe_impl="ragged"),
            make_mesh(expert=4, devices=jax.devices()[:4]),
        )
    with pytest.raises(TieraxError, match="moe_impl='megablox'.*capacity, ragged"):
        dataclasses.replace(cfg, moe_impl="megablox")


def test_compile_refuses_ragged_for_a_gpu_target(console_script):
    r = console_script(  # compile configures XLA at start-up: a process of its own
        "compile",
        "--model",
        "tiny-deepseek",
        "--set",
        "moe_impl=ragged",
        "--target",
        "h200",
    )
    assert r.returncode == 2
    assert "moe_impl=ragged" in r.stderr and "masked dense GEMM" in r.stderr
    assert "moe_impl=capacity" in r.stderr


def test_maxtext_emit_of_ragged_is_dropless_megablox():
    from tierax import plan as plan_lib
    from tierax.interop import maxtext

    def keys(cfg):
        plan = plan_lib.preset("remat-full", cfg)
        return maxtext.overrides(plan, cfg, microbatch=1, seq=128, mesh={"fsdp": 1}, target="v5p")

    ragged = keys(dataclasses.replace(get_config("tiny-deepseek"), moe_impl="ragged"))
    assert (ragged["capacity_factor"], ragged["sparse_matmul"], ragged["megablox"]) == (
        -1.0,
        True,
        True,
    )
    capacity = keys(get_config("tiny-deepseek"))
    assert (capacity["sparse_matmul"], capacity["megablox"]) == (False, False)


def test_what_the_step_refuses_is_refused_before_it_is_planned_or_emitted(cli):
    """simulate/plan with ragged experts on an expert- or tensor-parallel mesh, and a MaxText emit
    of ragged experts for a GPU target, exit 2 naming the fix (the step and compile refuse them)."""
    base = ("--model", "tiny-deepseek", "--set", "moe_impl=ragged")
    run = ("--plan", "minimal", "--microbatch", "2", "--seq", "64", "--target", "v5p")
    r = cli("simulate", *base, *run, "--devices", "4", "--mesh", "fsdp=2,expert=2")
    assert r.returncode == 2 and "takes no expert or tensor parallelism (expert=2)" in r.stderr
    r = cli("simulate", *base, *run, "--devices", "4", "--mesh", "fsdp=2,tensor=2")
    assert r.returncode == 2 and "(tensor=2)" in r.stderr and "moe_impl=capacity" in r.stderr
    r = cli("simulate", *base, *run, "--devices", "4", "--mesh", "fsdp=4")
    assert r.returncode == 0, r.stderr  # data/fsdp only: runs
    emit = ("plans", *base, "--emit", "maxtext", "--show", "minimal")
    r = cli(*emit, "--target", "h200")
    assert r.returncode == 2 and "TPU targets only" in r.stderr and not r.stdout
    r = cli(*emit, "--target", "v5p")
    assert r.returncode == 0 and "sparse_matmul: true" in r.stdout
