import dataclasses

import jax
import numpy as np
import pytest

from tierax import plan as P
from tierax.errors import TieraxError
from tierax.mesh import make_mesh
from tierax.models import get_config
from tierax.sharding import rules as sh
from tierax.train import step as S


def no_drop(cfg):
    """``cfg`` with a capacity no token overflows (experts/top-k slots per token), so a sharded
    step (capacity per device) and the 1-device step (capacity over the whole batch) agree."""
    if cfg.family != "deepseek":
        return cfg
    return dataclasses.replace(cfg, capacity_factor=cfg.num_experts / cfg.num_experts_per_tok)


def run_steps(cfg, plan_name, n, mesh=None, batch=8, seq=32):
    opt = S.make_optimizer(3e-3)
    graphdef, state = S.init_state(cfg, opt, seed=0, mesh=mesh)
    shardings = S.shardings_of(state) if mesh is not None else None
    fn = S.make_train_step(graphdef, cfg, P.preset(plan_name, cfg), opt, shardings)
    tokens = S.synthetic_batch(cfg, batch, seq, seed=3)
    if mesh is not None:
        tokens = jax.device_put(tokens, sh.batch_sharding(mesh))
    losses = []
    for _ in range(n):
        old = state
        state, m = fn(state, tokens)
        losses.append(float(m["loss"]))
    return state, losses, old


@pytest.mark.parametrize(
    "name", ["tiny-llama", pytest.param("tiny-deepseek", marks=pytest.mark.slow)]  # MoE: 12 s
)
def test_single_device_step_learns_and_donates(name):
    cfg = get_config(name)
    state, losses, old = run_steps(cfg, "qkv-offload", 6)
    assert losses[-1] < losses[0] - 0.1, losses
    assert int(state.step) == 6
    # The previous state's buffers were donated to the step.
    assert all(x.is_deleted() for x in jax.tree.leaves(old.params))


# tiny-deepseek on a mesh against one device is in the default suite as
# tests/test_parallel.py::test_sharded_step_equals_one_device (fsdp=2, tensor=2, expert=2); its
# runs here (12 s each) are slow.
FSDP_MODELS = ["tiny-llama", pytest.param("tiny-deepseek", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", FSDP_MODELS)
@pytest.mark.slow  # sharded and single-device training steps
def test_fsdp_mesh_matches_single_device(name):
    cfg = no_drop(get_config(name))
    _, single, _ = run_steps(cfg, "minimal", 3)
    mesh = make_mesh(data=2, fsdp=4)
    state, sharded, _ = run_steps(cfg, "minimal", 3, mesh=mesh)
    # Step 1 (same params, same batch) must agree to float precision.  After that, Adam's first
    # update (≈ lr·sign(g)) turns float-reassociation noise in near-zero gradient components into
    # full-size steps, and top-k routing amplifies it: later steps agree to 2e-3.
    np.testing.assert_allclose(sharded[0], single[0], rtol=1e-6)
    np.testing.assert_allclose(sharded, single, rtol=2e-3)
    # Parameters and Adam moments are really split over fsdp: the LM head kernel is 1/4 per device.
    head = state.params["head"]["kernel"][...]
    assert head.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp")
    shard = head.addressable_shards[0].data
    assert shard.size * 4 == head.size
    mu = state.opt_state[0].mu["head"]["kernel"][...]
    assert mu.sharding.is_equivalent_to(head.sharding, head.ndim)


def test_stacked_layer_axis_is_never_sharded():
    spec = sh.param_spec((jax.tree_util.DictKey("groups"),), (8, 64, 16), 8)
    assert spec == jax.sharding.PartitionSpec(None, "fsdp", None)


def test_mesh_and_batch_errors():
    with pytest.raises(TieraxError, match="8 are available"):
        make_mesh(data=3, fsdp=2)
    mesh = make_mesh(data=2, fsdp=4)
    with pytest.raises(TieraxError, match="not divisible by data×fsdp×expert = 8"):
        sh.check_batch(6, mesh)


@pytest.mark.parametrize("name", FSDP_MODELS)
def test_fsdp_gradients_match_single_device(name):
    cfg = no_drop(get_config(name))
    plan = P.preset("qkv-offload", cfg)
    tokens = S.synthetic_batch(cfg, 8, 32, seed=3)
    graphdef, params = S.init_params(cfg, seed=0)
    loss, grads = S.loss_and_grads(graphdef, cfg, plan, params, tokens)
    mesh = make_mesh(data=2, fsdp=4)
    _, sharded_params = S.init_params(cfg, seed=0, mesh=mesh)
    loss8, grads8 = S.loss_and_grads(
        graphdef, cfg, plan, sharded_params, jax.device_put(tokens, sh.batch_sharding(mesh))
    )
    assert float(loss8) == pytest.approx(float(loss), rel=1e-6)
    for a, b in zip(jax.tree.leaves(grads8), jax.tree.leaves(grads), strict=False):
        a, b = np.asarray(a), np.asarray(b)  # different device sets: compare on the host
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)) + 1e-8


def test_params_init_after_flax_eager_sharding_default_changes():
    """MaxText's import turns Flax's eager-sharding default off for the whole process; an init
    cached before must not be reused after, where every Param carries the other value (traced
    again, it failed with a pytree metadata mismatch against the cached output shardings)."""
    import flax
    import jax
    import numpy as np

    from tierax.models import get_config
    from tierax.train import step as step_lib

    cfg = get_config("tiny-llama")
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:1]).reshape(1, 1, 1, 1), ("data", "fsdp", "tensor", "expert")
    )
    before = flax.config.flax_always_shard_variable
    try:
        for value in (before, not before, before):
            flax.config.update("flax_always_shard_variable", value)
            jax.clear_caches()  # as some tests do: a cached init is traced again at its next call
            _, params = step_lib.init_params(cfg, seed=3, mesh=mesh)
            assert params["embed"]["embedding"].value.shape == (cfg.vocab_size, cfg.d_model)
    finally:
        flax.config.update("flax_always_shard_variable", before)
