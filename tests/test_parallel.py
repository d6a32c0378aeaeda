"""Expert and tensor parallelism and the expert-parallel MoE, on 8 host CPU devices.

The sharded step must compute what the 1-device step computes: loss and gradients
within 1e-5 (relative to the largest gradient entry), at a capacity that drops no
token.  A few meshes run by default; every preset on every mesh is ``slow``.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params

from tierax import names as N
from tierax import plan as plan_lib
from tierax.errors import TieraxError
from tierax.mesh import MeshShape, make_mesh, parse_mesh
from tierax.models import get_config
from tierax.models import moe as moe_lib
from tierax.sharding import rules as sh
from tierax.train import step as S

BATCH, SEQ = 8, 16


def no_drop(cfg):
    """Capacity = every token's k choices fit (experts / top-k × tokens·k / experts = tokens)."""
    if cfg.family != "deepseek":
        return cfg
    return dataclasses.replace(cfg, capacity_factor=cfg.num_experts / cfg.num_experts_per_tok)


# --- the reference: the dense capacity MoE tierax had before expert parallelism -------------------


def dense_capacity_moe(x_BSD, router, wi_0, wi_1, wo, cfg):
    """Global one-hot/cumsum dispatch into [E, C, D] buffers, einsum experts, gather back."""
    B, S_, D = x_BSD.shape
    E, k, T = cfg.num_experts, cfg.num_experts_per_tok, B * S_
    C = cfg.capacity(T)
    x_TD = x_BSD.reshape(T, D)
    scores = jax.nn.sigmoid(x_TD.astype(jnp.float32) @ router.astype(jnp.float32))
    top, expert = jax.lax.top_k(scores, k)
    gates = top / jnp.sum(top, -1, keepdims=True) * cfg.routed_scaling_factor
    expert_A = expert.reshape(T * k)
    onehot = jax.nn.one_hot(expert_A, E, dtype=jnp.int32)
    slot_A = jnp.sum((jnp.cumsum(onehot, 0) - 1) * onehot, -1)
    token_A = jnp.repeat(jnp.arange(T), k)
    buf = jnp.zeros((E, C, D), x_BSD.dtype).at[expert_A, slot_A].set(x_TD[token_A], mode="drop")
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", buf, wi_0)) * jnp.einsum("ecd,edf->ecf", buf, wi_1)
    y = jnp.einsum("ecf,efd->ecd", h, wo).at[expert_A, slot_A].get(mode="fill", fill_value=0)
    return jnp.sum((y * gates.reshape(T * k, 1)).reshape(T, k, D), 1).reshape(B, S_, D)


def _moe_inputs(cfg, seed=0):
    ks = jax.random.split(jax.random.key(seed), 5)
    E, D, F = cfg.num_experts, cfg.d_model, cfg.expert_mlp_dim
    return (
        jax.random.normal(ks[0], (BATCH, SEQ, D)),
        jax.random.normal(ks[1], (D, E)) * D**-0.5,
        jax.random.normal(ks[2], (E, D, F)) * D**-0.5,
        jax.random.normal(ks[3], (E, D, F)) * D**-0.5,
        jax.random.normal(ks[4], (E, F, D)) * F**-0.5,
    )


def _assert_close(a_tree, b_tree, rel=1e-5):
    for a, b in zip(jax.tree.leaves(a_tree), jax.tree.leaves(b_tree), strict=True):
        a, b = np.asarray(a), np.asarray(b)  # different device sets: compare on the host
        assert np.max(np.abs(a - b)) <= rel * np.max(np.abs(b)) + 1e-8


@pytest.mark.parametrize("capacity_factor", [1.25, None])
def test_moe_equals_dense_capacity_moe_on_one_device(capacity_factor):
    """On one device the sort-based dispatch keeps and drops exactly what the one-hot dispatch
    does."""
    cfg = get_config("tiny-deepseek")
    cfg = (
        no_drop(cfg)
        if capacity_factor is None
        else dataclasses.replace(cfg, capacity_factor=capacity_factor)
    )
    args = _moe_inputs(cfg)

    def loss(fn):
        return lambda *a: jnp.sum(jnp.sin(fn(*a, cfg)))

    new = jax.jit(jax.value_and_grad(loss(moe_lib.routed_experts), argnums=(0, 1, 2, 3, 4)))(*args)
    ref = jax.jit(jax.value_and_grad(loss(dense_capacity_moe), argnums=(0, 1, 2, 3, 4)))(*args)
    _assert_close(new, ref)


def test_expert_parallel_moe_equals_dense_capacity_moe():
    """expert=4 × fsdp=2: all-to-all dispatch, local expert GEMMs, all-to-all back — same values and
    grads."""
    cfg = no_drop(get_config("tiny-deepseek"))
    args = _moe_inputs(cfg, seed=1)
    mesh = make_mesh(fsdp=2, expert=4)

    def loss_ep(*a):
        return jnp.sum(jnp.sin(moe_lib.routed_experts(*a, cfg, mesh)))

    def loss_ref(*a):
        return jnp.sum(jnp.sin(dense_capacity_moe(*a, cfg)))

    x = jax.device_put(args[0], sh.batch_sharding(mesh))
    fn = jax.jit(jax.value_and_grad(loss_ep, argnums=(0, 1, 2, 3, 4)))
    got = fn(x, *args[1:])
    _assert_close(got, jax.jit(jax.value_and_grad(loss_ref, argnums=(0, 1, 2, 3, 4)))(*args))
    hlo = fn.lower(x, *args[1:]).compile().as_text()
    assert "all-to-all" in hlo


def test_dropped_assignments_are_counted():
    expert_Tk = jnp.array([[0, 1], [0, 2], [0, 1], [3, 0]])  # expert 0 chosen 4×, expert 1 2×
    assert int(moe_lib.dropped_assignments(expert_Tk, 4, capacity=2)) == 2
    assert int(moe_lib.dropped_assignments(expert_Tk, 4, capacity=4)) == 0
    assert list(moe_lib.slots(expert_Tk.reshape(-1), 4)) == [0, 0, 1, 0, 2, 1, 0, 3]
    cfg = get_config("tiny-deepseek")
    x, router = _moe_inputs(cfg)[:2]
    assert int(moe_lib.dropped_in_batch(x, router, no_drop(cfg), batch_shards=8)) == 0
    tight = dataclasses.replace(cfg, capacity_factor=0.25)
    assert int(moe_lib.dropped_in_batch(x, router, tight, batch_shards=8)) > 0


@pytest.mark.slow
def test_model_reports_dropped_tokens_per_moe_layer():
    from flax import nnx

    from tierax.models import build_model

    cfg = get_config("tiny-deepseek")
    tokens = S.synthetic_batch(cfg, BATCH, SEQ)[:, :-1]
    graphdef, params = nnx.split(build_model(cfg))

    @functools.partial(jax.jit, static_argnums=0)
    def drops(graphdef, params, tokens):
        return nnx.merge(graphdef, params).moe_dropped(tokens, batch_shards=8)

    tight = nnx.split(build_model(dataclasses.replace(cfg, capacity_factor=0.5)))[0]
    got = drops(tight, params, tokens)
    assert (
        got.shape == (cfg.num_moe_layers,) and int(got.min()) > 0
    )  # half the slots needed: some dropped
    assert not drops(nnx.split(build_model(no_drop(cfg)))[0], params, tokens).any()


# --- bad input ------------------------------------------------------------------------------------


def test_mesh_must_divide_heads_experts_and_batch():
    llama = get_config("tiny-llama")  # 4 heads, 2 kv heads, mlp 128
    with pytest.raises(
        TieraxError, match=r"num_kv_heads=2 is not divisible by tensor=4.*choose tensor/expert"
    ):
        MeshShape(fsdp=2, tensor=4).check_model(llama)
    deepseek = get_config("tiny-deepseek")  # 8 experts
    with pytest.raises(TieraxError, match="num_experts=8 is not divisible by expert=3"):
        MeshShape(expert=3).check_model(deepseek)
    with pytest.raises(TieraxError, match=r"12 is not divisible by data×fsdp×expert = 8"):
        MeshShape(fsdp=2, expert=4).check_batch(12)
    MeshShape(fsdp=2, tensor=2, expert=2).check_model(deepseek)  # fits
    MeshShape(expert=8).check_model(llama)  # a dense model on an expert axis: batch/weights only
    with pytest.raises(TieraxError, match="num_heads=4 is not divisible by tensor=8"):
        S.init_params(llama, mesh=make_mesh(tensor=8))


@pytest.mark.parametrize(
    "mesh, works",
    [
        (MeshShape(fsdp=3), "data=3,fsdp=1,tensor=1,expert=1"),
        (MeshShape(fsdp=6), "data=3,fsdp=2,tensor=1,expert=1"),
        (MeshShape(fsdp=3, expert=2), "data=3,fsdp=1,tensor=1,expert=2"),
    ],
)
def test_an_fsdp_group_not_dividing_d_model_is_refused_naming_a_mesh_that_works(mesh, works):
    """The sharding rules leave a weight whole where no dimension divides: llama3-8b on fsdp=3 would
    keep most of its state replicated (silently, before)."""
    cfg = get_config("llama3-8b")  # d_model 4096
    # What the refused mesh would do to an MLP kernel: shard neither dimension.
    spec = sh.param_spec((), (4096, 14336), {"fsdp": mesh.fsdp, "expert": mesh.expert})
    assert all(d is None for d in spec)
    with pytest.raises(TieraxError) as e:
        mesh.check_model(cfg, where="--mesh")
    msg = str(e.value)
    assert "which does not divide d_model=4096" in msg and f"--mesh {works}" in msg, msg
    parse_mesh(works).check_model(cfg)  # the named mesh is accepted


def test_tensor_and_expert_param_specs():
    from flax import nnx

    from tierax.models import abstract_model

    mesh = make_mesh(fsdp=2, tensor=2, expert=2)
    _, abstract = nnx.split(abstract_model(get_config("tiny-deepseek")))
    specs = jax.tree.map(lambda s: s.spec, sh.param_shardings(abstract, mesh))
    PS = jax.sharding.PartitionSpec
    moe = specs["groups"]["moe"]
    assert moe["mlp"]["wi_0"] == PS(None, "expert", "fsdp", "tensor")
    assert moe["mlp"]["wo"] == PS(None, "expert", "tensor", "fsdp")
    assert moe["attention"]["wq_b"]["kernel"] == PS(None, ("fsdp", "expert"), "tensor")
    assert moe["attention"]["wo"]["kernel"] == PS(None, "tensor", ("fsdp", "expert"))
    assert moe["mlp"]["shared"]["wi_1"]["kernel"] == PS(None, ("fsdp", "expert"), "tensor")
    assert specs["head"]["kernel"] == PS(None, ("fsdp", "expert"))


# --- the whole step: sharded == 1 device ----------------------------------------------------------

_REFS: dict = {}


def _reference(name, preset):
    key = (name, preset)
    if key not in _REFS:
        cfg = no_drop(get_config(name))
        graphdef, params = S.init_params(cfg, seed=0)
        tokens = S.synthetic_batch(cfg, BATCH, SEQ, seed=3)
        _REFS[key] = (
            tokens,
            S.loss_and_grads(graphdef, cfg, plan_lib.preset(preset, cfg), params, tokens),
        )
    return _REFS[key]


def check_sharded_step(name, preset, mesh_kw, loss_tiles=1):
    """The sharded step (optionally with a tiled loss) against the untiled 1-device step."""
    cfg = dataclasses.replace(no_drop(get_config(name)), loss_tiles=loss_tiles)
    tokens, (loss, grads) = _reference(name, preset)
    mesh = make_mesh(**mesh_kw)
    graphdef, params = S.init_params(cfg, seed=0, mesh=mesh)
    loss8, grads8 = S.loss_and_grads(
        graphdef,
        cfg,
        plan_lib.preset(preset, cfg),
        params,
        jax.device_put(tokens, sh.batch_sharding(mesh)),
    )
    assert float(loss8) == pytest.approx(float(loss), rel=1e-5)
    _assert_close(grads8, grads)


MESHES = [
    dict(data=2, tensor=2, fsdp=2),
    dict(fsdp=4, expert=2),
    dict(data=2, expert=4),
    dict(fsdp=2, tensor=2, expert=2),
]
# Default suite: one compile-heavy case per model (expert=4 is covered at the layer level above).
FAST = [
    pytest.param(  # the MoE model on all three axes: 20 s here
        "tiny-deepseek",
        "deepseek-offload",
        dict(fsdp=2, tensor=2, expert=2),
        1,
        marks=pytest.mark.slow,
    ),
    ("tiny-llama", "qkv-offload", dict(data=2, tensor=2, fsdp=2), 4),
]


@pytest.mark.parametrize(
    "name,preset,mesh_kw,loss_tiles",
    FAST,
    ids=lambda v: str(v) if not isinstance(v, dict) else ",".join(f"{k}={n}" for k, n in v.items()),
)
def test_sharded_step_equals_one_device(name, preset, mesh_kw, loss_tiles):
    check_sharded_step(name, preset, mesh_kw, loss_tiles)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mesh_kw", MESHES, ids=lambda v: ",".join(f"{k}={n}" for k, n in v.items())
)
@pytest.mark.parametrize("preset", list(plan_lib.PRESETS))
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-deepseek"])
def test_every_preset_on_every_mesh(name, preset, mesh_kw):
    check_sharded_step(name, preset, mesh_kw, loss_tiles=2)


@pytest.mark.parametrize("mechanism", ["policy", "prefetch"])
def test_moe_names_are_where_the_remat_policy_sees_them(mechanism):
    """On an expert mesh the expert GEMM outputs are tagged in the layer body (not inside a
    shard_map, where a plan could not place them), at the per-device size the inventory traces:
    under a jax.checkpoint (XLA's policy) or in the prefetching scan's custom VJP."""
    import dataclasses

    from flax import nnx

    from tierax.models import abstract_model

    cfg = no_drop(get_config("tiny-deepseek"))
    mesh = make_mesh(fsdp=2, expert=4)
    graphdef, params = nnx.split(abstract_model(cfg))
    plan = dataclasses.replace(plan_lib.preset("deepseek-offload", cfg), mechanism=mechanism)
    loss = S.make_loss_fn(graphdef, plan_lib.to_policies(plan, cfg), mesh)
    closed = jax.make_jaxpr(loss)(params, jax.ShapeDtypeStruct((BATCH, SEQ + 1), jnp.int32))

    found = {}

    def walk(jaxpr, parents):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "name" and eqn.params["name"].startswith("moe_mlp"):
                found[eqn.params["name"]] = (eqn.outvars[0].aval.shape, parents)
            for sub in jaxprs_in_params(eqn.params):
                walk(sub, parents + (eqn.primitive.name,))

    walk(closed.jaxpr, ())
    assert set(found) == {N.MOE_MLPWI_0, N.MOE_MLPWI_1, N.MOE_MLPWO}
    for _, parents in found.values():
        assert "shard_map" not in parents
        if mechanism == "policy":
            assert any(p.startswith("remat") or p == "checkpoint" for p in parents), parents
        else:
            assert any(p.startswith("custom_vjp") for p in parents), parents
    # Global [E, devices × C_local, F], split over expert (E) and fsdp (tokens): per device
    # E × C_local × F, the size the inventory traces at the per-device batch.
    E, F = cfg.num_experts, cfg.expert_mlp_dim
    c_local = cfg.capacity(BATCH // mesh.size * SEQ)
    assert found[N.MOE_MLPWI_0][0] == (E, mesh.size * c_local, F)
    assert np.prod(found[N.MOE_MLPWI_0][0]) // mesh.size == E * c_local * F


@pytest.mark.slow
def test_trainer_on_expert_tensor_mesh_matches_one_device(tmp_path):
    """`tierax train`'s Trainer: 3 steps on fsdp=2,tensor=2,expert=2 give the 1-device run's
    losses."""
    from tierax.models import config_to_dict
    from tierax.train import config as TC
    from tierax.train import loop as L

    model = config_to_dict(no_drop(get_config("tiny-deepseek")))

    def losses(mesh, microbatch, name):
        cfg = TC.config_from_mapping(
            {
                "model": model,
                "plan": "minimal",
                "microbatch": microbatch,
                "seq": SEQ,
                "steps": 3,
                "mesh": mesh,
                "optimizer": {"lr": 0.003, "warmup_steps": 1},
                "checkpoint": {"every": 0},
                "log": {"dir": str(tmp_path / name), "every": 1, "plot": False},
            }
        )
        with L.Trainer(cfg, devices=jax.devices()[: cfg.mesh.size]) as trainer:
            return trainer.train().losses

    one = losses({"fsdp": 1}, 8, "one")  # global batch 8 either way
    sharded = losses({"fsdp": 2, "tensor": 2, "expert": 2}, 2, "sharded")
    np.testing.assert_allclose(sharded, one, rtol=1e-5)
