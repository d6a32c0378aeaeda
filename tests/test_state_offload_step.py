"""The step with a plan's moments in host memory (tierax.train.streamed): on CPU the placement is a
no-op for memory, so the streamed layer-by-layer update must give bit-identical parameters and
moments to the ordinary update after several steps, with the moments really in ``pinned_host``
arrays between steps; what the step does not run is refused before it is built."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax
import pytest
from ulps import assert_within_ulps

from tierax import plan as P
from tierax.errors import TieraxError
from tierax.mesh import make_mesh
from tierax.models import get_config
from tierax.sharding import rules as sh
from tierax.train import step as S


def with_state(plan: P.Plan, **kinds) -> P.Plan:
    return dataclasses.replace(plan, state={g: kinds for g in plan.groups})


def run(cfg, plan, n, mesh=None, opt=None, grad_clip=None):
    opt = opt or S.make_optimizer(3e-3)
    graphdef, state = S.init_state(cfg, opt, seed=0, mesh=mesh, plan=plan)
    fn = S.make_train_step(graphdef, cfg, plan, opt, S.shardings_of(state), grad_clip=grad_clip)
    tokens = S.synthetic_batch(cfg, 8, 16, seed=3)  # 8: one row per device of a CPU mesh
    if mesh is not None:
        tokens = jax.device_put(tokens, sh.batch_sharding(mesh))
    for _ in range(n):
        state, _ = fn(state, tokens)
    return state


def host_kinds(tree) -> dict:
    out = {}
    for path, x in jax.tree_util.tree_leaves_with_path(tree):
        out.setdefault(P.layer_group_of(path), set()).add(x.sharding.memory_kind)
    return out


@pytest.mark.parametrize(
    "name, mesh",
    [
        ("tiny-llama", None),
        # Two layer groups (only moe's streamed) and an FSDP mesh: a minute or more each here.
        pytest.param("tiny-deepseek", None, marks=pytest.mark.slow),
        pytest.param("tiny-llama", {"data": 2, "fsdp": 4}, marks=pytest.mark.slow),
    ],
)
def test_streamed_update_is_bit_identical(name, mesh):
    cfg = get_config(name)
    m = None if mesh is None else make_mesh(**mesh)
    base = P.preset("minimal", cfg)
    ref = run(cfg, base, 3, m)
    # Offload one group's moments (tiny-deepseek: the moe group only; the dense one stays).
    group = list(base.groups)[-1]
    plan = dataclasses.replace(base, state={group: {"moments": "offload"}})
    got = run(cfg, plan, 3, m)
    kinds = host_kinds(got.opt_state)
    assert kinds[group] == {"pinned_host"}
    assert all(k == {"device"} for g, k in kinds.items() if g != group)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(got.step) == 3


def test_unrun_state_placements_refused_before_building():
    cfg = get_config("tiny-llama")
    opt = S.make_optimizer(3e-3)
    graphdef, state = S.init_state(cfg, opt, seed=0)
    base = P.preset("minimal", cfg)
    # An offloaded accumulator in a step of one microbatch per update: there is none to place.
    with pytest.raises(TieraxError, match=r"accumulator of decoder.*grad_accum = 1"):
        S.make_train_step(graphdef, cfg, with_state(base, grad_accum="offload"), opt)
    with pytest.raises(TieraxError, match="state_shardings"):  # with two microbatches it runs
        S.make_train_step(graphdef, cfg, with_state(base, grad_accum="offload"), opt, grad_accum=2)
    with pytest.raises(TieraxError, match="state_shardings"):  # master weights run, given these
        S.make_train_step(graphdef, cfg, with_state(base, master_weights="offload"), opt)
    with pytest.raises(TieraxError, match="state_shardings"):
        S.make_train_step(graphdef, cfg, with_state(base, moments="offload"), opt)


def test_clipped_streamed_update_is_bit_identical():
    """A global-norm clip with streamed moments: the norm of every gradient is taken before the
    layers stream (two passes), so the result equals Optax's own clip-then-AdamW chain on device —
    with the clip active (the gradient norm is far above 0.05 at every step) — within 4 float32
    ulps of each leaf's largest magnitude: the norm's sum runs in another order than Optax's
    whole-tree one (on jax 0.12's XLA:CPU the clip's scale then differs in its last bit from the
    second step; jax 0.10.2 gave the same bits)."""
    cfg = get_config("tiny-llama")
    clip = 0.05
    base = P.preset("minimal", cfg)
    # The reference: Optax's clip_by_global_norm, not tierax's, with the moments on device.
    optax_chain = optax.chain(
        optax.clip_by_global_norm(clip),
        optax.adamw(3e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1),
    )
    ref = run(cfg, base, 3, opt=optax_chain)
    plan = with_state(base, moments="offload")
    opt = S.make_optimizer(3e-3, grad_clip=clip)
    graphdef, state = S.init_state(cfg, opt, seed=0, plan=plan)
    fn = S.make_train_step(graphdef, cfg, plan, opt, S.shardings_of(state), grad_clip=clip)
    tokens = S.synthetic_batch(cfg, 8, 16, seed=3)
    for _ in range(3):
        state, metrics = fn(state, tokens)
        assert float(metrics["grad_norm"]) > 10 * clip  # the clip scales every step
    assert host_kinds(state.opt_state)["decoder"] == {"pinned_host"}
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(state), strict=True):
        assert_within_ulps(np.asarray(b), np.asarray(a))


@pytest.mark.parametrize("clip", [0.05, 1e6])  # clipping, and a norm far below the clip
def test_make_optimizers_clip_is_optaxs(clip):
    """``make_optimizer(grad_clip=...)``'s clip (which also takes the norm from outside) equals
    Optax's ``clip_by_global_norm`` bit for bit on a whole tree, as every train run uses it."""
    keys = jax.random.split(jax.random.key(0), 6)
    params = {"a": jax.random.normal(keys[0], (5, 7)), "b": {"c": jax.random.normal(keys[1], (9,))}}
    ref = optax.chain(
        optax.clip_by_global_norm(clip),
        optax.adamw(3e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1),
    )
    got = S.make_optimizer(3e-3, grad_clip=clip)
    states = [ref.init(params), got.init(params)]
    for k in keys[2:]:
        grads = jax.tree.map(lambda p, k=k: 3.0 * jax.random.normal(k, p.shape), params)
        outs = [
            jax.jit(opt.update)(grads, st, params)
            for opt, st in zip((ref, got), states, strict=True)
        ]
        for a, b in zip(*(jax.tree.leaves(o) for o in outs), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        states = [o[1] for o in outs]
