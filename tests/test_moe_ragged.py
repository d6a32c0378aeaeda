"""``moe_impl: ragged`` — dropless grouped matmuls (``jax.lax.ragged_dot``) — against the capacity
form where the capacity drops nothing: the same routed-expert output and the same gradients, on
one device, on a 4-device fsdp mesh of the CPU backend and, in the ring-of-experts form, on expert-
and tensor-parallel meshes; the inventory's sizes of the ring's buffers against the sharded step's
own."""

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


@pytest.mark.parametrize(
    "mesh_kw",
    [dict(expert=4), dict(expert=2, tensor=2), dict(fsdp=2, expert=2), dict(tensor=4)],
    ids=lambda kw: ",".join(f"{a}={n}" for a, n in kw.items()),
)
def test_ragged_ring_of_experts_equals_the_one_device_capacity_form(mesh_kw):
    """Under expert (and tensor) parallelism the ring form — tokens all-gathered over expert, each
    shard's experts as grouped GEMMs, partial outputs reduce-scattered back — computes what the
    capacity form computes on one device where it drops nothing: output and gradients."""
    cfg, args, w = _setup(capacity_factor=4.0)
    out_c, g_c = _value_and_grads(cfg, args, w)
    mesh = make_mesh(**mesh_kw, devices=jax.devices()[:4])
    out_r, g_r = _value_and_grads(dataclasses.replace(cfg, moe_impl="ragged"), args, w, mesh)
    np.testing.assert_allclose(out_r, out_c, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_r, g_c, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("k", [2, 4])
def test_ragged_ring_is_dropless_when_one_shard_gets_every_assignment(k):
    """The ring's buffer holds every assignment a shard can get: with every token routed to the
    same k experts (a router that ignores the token; 2 local experts per shard), shard 0 gets
    min(2, k) of every token's choices, a full buffer, and nothing is lost."""
    cfg, (x, router, wi_0, wi_1, wo), w = _setup(capacity_factor=4.0)
    cfg = dataclasses.replace(cfg, num_experts_per_tok=k)
    router = jnp.zeros_like(router).at[:, :k].set(1.0 - 0.1 * jnp.arange(k))
    x = jnp.abs(x)  # positive inputs: experts 0 … k−1 score highest for every token
    args = (x, router, wi_0, wi_1, wo)
    out_c, g_c = _value_and_grads(cfg, args, w)
    mesh = make_mesh(expert=4, devices=jax.devices()[:4])
    ragged = dataclasses.replace(cfg, moe_impl="ragged")
    gates, experts = moe_lib.route(x.reshape(-1, x.shape[-1]), router, cfg)
    assert set(np.unique(experts).tolist()) == set(range(k))  # the fixture fills the buffer
    out_r, g_r = _value_and_grads(ragged, args, w, mesh)
    np.testing.assert_allclose(out_r, out_c, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_r, g_c, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("ep", [2, 4])
def test_ring_combine_never_reads_rows_past_the_shards_assignments(ep):
    """A grouped-matmul kernel need not write the rows past its groups (CPU's ``ragged_dot`` zeroes
    them; a TPU kernel may leave them as they were): the combine reads only the shard's own
    assignments.  With every row of the GEMM output 1 — the rows past the groups too — each token's
    output is the sum of its k gates (each assignment counted once, on the shard that holds its
    expert) by hand; a combine that read the rows past the groups counts another shard's
    assignments again."""
    cfg, (x, router, *_), _ = _setup(capacity_factor=4.0)
    E, k = cfg.num_experts, cfg.num_experts_per_tok
    assert E // ep >= k  # R = G·k rows: another shard's assignments sit inside the buffer
    B, S, D = x.shape
    gates, experts = moe_lib.route(x.reshape(-1, D), router, cfg)
    mesh = make_mesh(expert=ep, devices=jax.devices()[:ep])
    P = jax.sharding.PartitionSpec

    def ring(x_TD, expert_Tk, gates_Tk):
        shard = jax.lax.axis_index(moe_lib.EXPERT_AXIS)
        x_RD, sizes_e, order, gates_Gk = moe_lib._ragged_dispatch(
            x_TD, expert_Tk, gates_Tk, E, jnp.float32, ep, shard
        )
        ones = jnp.ones_like(x_RD)  # rows past the groups written too
        return moe_lib._ragged_combine(ones, sizes_e, order, gates_Gk, ep, 1), jnp.sum(sizes_e)[
            None
        ]

    row = P(moe_lib.EXPERT_AXIS)
    out, own = jax.jit(
        jax.shard_map(
            ring,
            mesh=mesh,
            in_specs=(P(moe_lib.EXPERT_AXIS, None),) * 3,
            out_specs=(P(moe_lib.EXPERT_AXIS, None), row),
            check_vma=False,
        )
    )(x.reshape(-1, D), experts, gates)
    rows = ep * (B * S // ep) * k
    assert (np.asarray(own) < rows).all()  # every shard's buffer has rows past its assignments
    want = np.broadcast_to(np.asarray(gates).sum(-1, keepdims=True), (B * S, D))
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_unknown_moe_impls_are_refused():
    cfg, _, _ = _setup(capacity_factor=4.0)
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


def test_simulate_takes_ragged_on_expert_and_tensor_meshes_and_emit_refuses_gpu(cli):
    """simulate with ragged experts on expert- and tensor-parallel meshes runs (the ring form);
    a MaxText emit of ragged experts for a GPU target exits 2 naming the fix."""
    base = ("--model", "tiny-deepseek", "--set", "moe_impl=ragged")
    run = ("--plan", "minimal", "--microbatch", "2", "--seq", "64", "--target", "v5p")
    for mesh in ("fsdp=2,expert=2", "fsdp=2,tensor=2", "fsdp=4"):
        r = cli("simulate", *base, *run, "--devices", "4", "--mesh", mesh)
        assert r.returncode == 0, r.stderr
    emit = ("plans", *base, "--emit", "maxtext", "--show", "minimal")
    r = cli(*emit, "--target", "h200")
    assert r.returncode == 2 and "TPU targets only" in r.stderr and not r.stdout
    r = cli(*emit, "--target", "v5p")
    assert r.returncode == 0 and "sparse_matmul: true" in r.stdout


def _tagged_shapes(cfg, mesh, batch, seq):
    """Per-device shapes of the routed experts' tagged values in the sharded step's loss."""
    from flax import nnx
    from jax.extend.core import jaxprs_in_params

    from tierax import plan as plan_lib
    from tierax.models import abstract_model
    from tierax.train import step as S

    graphdef, params = nnx.split(abstract_model(cfg))
    loss = S.make_loss_fn(
        graphdef, plan_lib.to_policies(plan_lib.preset("minimal", cfg), cfg), mesh
    )
    closed = jax.make_jaxpr(loss)(params, jax.ShapeDtypeStruct((batch, seq + 1), jnp.int32))
    found = {}

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "name" and eqn.params["name"].startswith("moe_mlp"):
                found[eqn.params["name"]] = eqn.outvars[0].aval
            for sub in jaxprs_in_params(eqn.params):
                walk(sub)

    walk(closed.jaxpr)
    return found


@pytest.mark.parametrize(
    "model, mesh_kw, k",
    [
        ("tiny-deepseek", dict(fsdp=2, expert=2), 2),
        ("tiny-deepseek", dict(expert=4), 2),
        ("tiny-deepseek", dict(expert=4), 4),
        ("tiny-mixtral", dict(fsdp=2, expert=2), 2),
    ],
    # k=4: fewer local experts than choices; Mixtral: the llama family's MoE layer, same ring
    ids=["fsdp=2,expert=2", "expert=4", "expert=4,k=4", "mixtral-fsdp=2,expert=2"],
)
def test_inventory_sizes_the_ring_buffers_as_the_sharded_step_holds_them(model, mesh_kw, k):
    """The inventory traces one device's own assignments; the ring's grouped GEMMs run on
    ep × tokens × min(E/ep, k) rows.  Its named residuals must have the per-device size of the
    sharded step's own tagged values (read from its jaxpr, between the shard_maps), and the
    all-gather/reduce-scatter bytes and backward buffers the hand counts."""
    from tierax.tracing import inventory as inv_lib

    cfg = dataclasses.replace(get_config(model), moe_impl="ragged", num_experts_per_tok=k)
    batch, seq = 8, 16
    mesh = make_mesh(**mesh_kw, devices=jax.devices()[:4])
    shapes = _tagged_shapes(cfg, mesh, batch, seq)
    inv = inv_lib.model_inventory(cfg, batch // 4, seq, mesh_kw)
    (group,) = [g for g in inv.groups if g.expert_param_count_per_layer]
    traced = {a.name: a.bytes_per_layer for a in group.activations if a.name in shapes}
    # global values in the layer body, split over every device of the (tensor-free) mesh
    per_device = {n: int(np.prod(a.shape)) * a.dtype.itemsize // 4 for n, a in shapes.items()}
    assert traced == per_device and len(traced) == 3
    ep, T, D = mesh_kw["expert"], 2 * seq, cfg.d_model
    rows = ep * T * min(cfg.num_experts // ep, k)  # by hand: 128 at ep=2, 256 at ep=4 (k 2 or 4)
    assert shapes["moe_mlpwi_0"].shape == (4 * rows, cfg.expert_mlp_dim)
    assert shapes["moe_mlpwo"].shape == (1, 4 * rows, D)
    # all-gather x (f32), experts (int32) and gates (f32); reduce-scatter the f32 outputs
    sent = (ep - 1) / ep * (ep * T * (D * 4 + k * 8) + ep * T * D * 4)
    assert dict(group.forward_collective_bytes_by_axis)["expert"] == pytest.approx(sent)
    assert moe_lib.backward_buffer_bytes(cfg, T, ep) == 4 * rows * D * 4


# remat-full under -m slow: deepseek-offload (default) runs the same sharded ring with names
# both offloaded and recomputed inside it.
@pytest.mark.parametrize(
    "preset", ["deepseek-offload", pytest.param("remat-full", marks=pytest.mark.slow)]
)
def test_sharded_ragged_step_equals_the_one_device_capacity_step(preset):
    """The whole step, ragged experts on fsdp=2,tensor=2,expert=2 under a plan (the names inside the
    ring's shard_map placed by the layer's policy), against the one-device capacity step where the
    capacity drops nothing: the loss and every gradient."""
    from tierax import plan as plan_lib
    from tierax.sharding import rules as sh
    from tierax.train import step as S

    base = get_config("tiny-deepseek")
    # Its two MoE layers alone (the ring is the MoE layer's; the dense group is one more loop and
    # its parameters one more init to compile, on one device and on eight).
    cfg = dataclasses.replace(
        base,
        capacity_factor=base.num_experts / base.num_experts_per_tok,
        num_layers=base.num_layers - base.first_dense_layers,
        first_dense_layers=0,
    )
    tokens = S.synthetic_batch(cfg, 8, 16, seed=3)
    graphdef, params = S.init_params(cfg, seed=0)
    loss, grads = S.loss_and_grads(graphdef, cfg, plan_lib.preset(preset, cfg), params, tokens)
    ragged = dataclasses.replace(cfg, moe_impl="ragged")
    mesh = make_mesh(fsdp=2, tensor=2, expert=2, devices=jax.devices()[:8])
    graphdef, params = S.init_params(ragged, seed=0, mesh=mesh)
    tokens8 = jax.device_put(tokens, sh.batch_sharding(mesh))
    loss8, grads8 = S.loss_and_grads(
        graphdef, ragged, plan_lib.preset(preset, ragged), params, tokens8
    )
    assert float(loss8) == pytest.approx(float(loss), rel=1e-5)
    for a, b in zip(jax.tree.leaves(grads8), jax.tree.leaves(grads), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)) + 1e-8
