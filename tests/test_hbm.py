"""Non-matmul HBM bytes (tierax.tracing.hbm) against hand counts from shapes under the documented
fusion model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest

from tierax import costmodel as cm
from tierax.models import get_config
from tierax.tracing import hbm
from tierax.tracing.inventory import GroupInventory, Inventory
from tierax.tracing.model_program import for_inventory

T, D, F = 8, 16, 32  # tokens, model width, MLP width; float32 throughout: 4 bytes an element
F32 = jnp.float32


def sds(*shape):
    return jax.ShapeDtypeStruct(shape, F32)


def tiny_layer(x, p):
    """RMSNorm → gate/up matmuls → SwiGLU → down matmul → residual add."""
    g, wa, wb, wo = p
    r = jnp.mean(x * x, axis=-1, keepdims=True)  # reduction fusion
    n = x * jax.lax.rsqrt(r + 1e-6) * g[None, :]  # normalise fusion: a matmul operand
    a, b = n @ wa, n @ wb
    u = a * jax.nn.sigmoid(a) * b  # SwiGLU fusion: a matmul operand
    return x + u @ wo  # residual fusion: the output


PARAMS = (sds(D), sds(D, F), sds(D, F), sds(F, D))


def test_tiny_layer_forward_bytes_by_hand():
    # reduction fusion: reads x [T,D], writes r [T]; normalise: reads x, r, g [D], writes n [T,D];
    # SwiGLU: reads a, b [T,F], writes u [T,F]; residual: reads x and the down matmul's output,
    # writes y [T,D].
    expected = 4 * ((T * D + T) + (T * D + T + D + T * D) + 3 * T * F + 3 * T * D)
    fwd, bwd = hbm.phase_bytes(jax.make_jaxpr(tiny_layer)(sds(T, D), PARAMS))
    assert (fwd, bwd) == (expected, 0)


def test_reductions_end_fusions_and_producers_are_repeated():
    """softmax(h) of a matmul's output h [T,F]: max (reads h, writes m [T]); exp and sum (reads h,
    m; writes s);
    the normalised output (reads h, m, s; writes p [T,F]) — h is read three times, as XLA's fusions
    do."""

    def f(x, w):
        h = x @ w
        m = jnp.max(h, axis=-1, keepdims=True)
        e = jnp.exp(h - m)
        return e / jnp.sum(e, axis=-1, keepdims=True)

    fwd, _ = hbm.phase_bytes(jax.make_jaxpr(f)(sds(T, D), sds(D, F)))
    assert fwd == 4 * ((T * F + T) + (T * F + T + T) + (T * F + T + T + T * F))


def test_residuals_cross_phases_written_then_read():
    """sin under jax.vjp: the forward's two fusions (no shared edge: siblings are not merged) each
    read x, and
    write sin x (the output) and cos x (a residual); the backward reads the cotangent and cos x and
    writes the gradient."""

    def f_b(x, ct):
        y, vjp = jax.vjp(jnp.sin, x)
        return y, vjp(hbm.marker(ct))

    fwd, bwd = hbm.phase_bytes(jax.make_jaxpr(f_b)(sds(T, D), sds(T, D)))
    assert (fwd, bwd) == (4 * 4 * T * D, 3 * 4 * T * D)


def test_layer_bytes_backward_is_counted_and_larger():
    fwd, bwd = hbm.layer_bytes(tiny_layer, sds(T, D), PARAMS)
    assert fwd >= 4 * (6 * T * D + 3 * T * F)  # the forward at least (residuals add writes)
    assert bwd > fwd


def test_optimizer_bytes_by_hand_and_from_the_real_adamw_update():
    """AdamW per parameter: read param, grad, mu, nu; write param, mu, nu → 7 × the parameter bytes.
     The fusion
    model on optax's own update (one [N] float32 tensor) counts the same, plus a few scalars (step
    count)."""
    n = 4096
    assert hbm.optimizer_bytes(4 * n) == 7 * 4 * n
    opt = optax.adamw(1e-3, weight_decay=0.1)
    p = sds(n)
    state = jax.eval_shape(opt.init, p)

    def step(params, grads, state):
        updates, new_state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), new_state

    fwd, _ = hbm.phase_bytes(jax.make_jaxpr(step)(p, p, state))
    assert 7 * 4 * n <= fwd <= 7 * 4 * n + 64


def test_cost_model_adds_the_optimizer_and_loss_at_hbm_bandwidth():
    """compute_s = matmul seconds + (2 layers' forward and backward + the loss + 7 × 1 GB of
    parameters) / 2 TB/s."""
    g = GroupInventory(
        "g",
        2,
        (),
        carry_bytes_per_layer=0,
        save_all_bytes_per_layer=0,
        base_recompute_flops_per_layer=0.0,
        forward_flops_per_layer=1e9,
        layer_param_count=0,
        forward_hbm_bytes_per_layer=1e8,
        backward_hbm_bytes_per_layer=3e8,
    )
    inv = Inventory(
        "t",
        1,
        1,
        {"data": 1, "fsdp": 1},
        (g,),
        param_bytes=10**9,
        grad_bytes=10**9,
        optimizer_bytes=2 * 10**9,
        logits_bytes=0,
        embed_param_count=0,
        loss_hbm_bytes=5e8,
    )
    rates = cm.Rates("t", 1e12, 2e12, 1e9, 1e9, 1e9, 10**12, 10**12, True)

    cfg = get_config("tiny-llama")  # d_model 64, vocab 256: one token's head is 2 · 64 · 256 FLOPs
    assert (cfg.d_model, cfg.vocab_size) == (64, 256)
    fx = cm.fixed_terms(for_inventory(cfg, inv), rates, "serial")
    # layers 2 × (0.1 + 0.3) GB + loss 0.5 GB + AdamW 7 GB = 8.3 GB at 2 TB/s = 4.15 ms; matmuls 3 ×
    # (2 GFLOP + head)
    assert fx.hbm_s == pytest.approx(8.3e9 / 2e12, rel=1e-12)
    assert fx.compute_s == pytest.approx(3 * (2e9 + 2 * 64 * 256) / 1e12 + 8.3e9 / 2e12, rel=1e-12)


def test_slices_read_only_the_slice_and_updates_write_in_place():
    """In a stacked buffer [T, D]: a dynamic slice's fusion reads the [1, D] row (and the int32
    index) and writes
    its result; a dynamic update's fusion reads the update and the index and writes only the [1, D]
    row in place."""

    def f(buf, upd, i):
        a = jax.lax.dynamic_slice_in_dim(buf, i, 1) * 3.0
        b = jax.lax.dynamic_update_slice_in_dim(buf, upd * 2.0, i, axis=0)
        return a, b

    fwd, _ = hbm.phase_bytes(
        jax.make_jaxpr(f)(sds(T, D), sds(1, D), jax.ShapeDtypeStruct((), jnp.int32))
    )
    assert fwd == (4 * D + 4 + 4 * D) + (4 * D + 4 + 4 * D)


def test_a_sharded_weights_own_work_moves_its_shards_bytes():
    """The cast of a float32 weight [D, F] to bfloat16 before its matmul (and of its transpose in
    the backward) moves the shard's bytes when the mesh splits the weight 4 ways — XLA casts the
    shard before gathering it; activations keep their bytes."""

    def f(x, w):
        return x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)

    jaxpr = jax.make_jaxpr(f)(sds(T, D), sds(D, F))
    whole, _ = hbm.phase_bytes(jaxpr)
    # x's cast: reads T·D float32, writes T·D bfloat16; w's cast: D·F float32 in, bfloat16 out.
    assert whole == (4 + 2) * T * D + (4 + 2) * D * F
    sharded, _ = hbm.phase_bytes(jaxpr, {(D, F): 4})
    assert sharded == (4 + 2) * T * D + (4 + 2) * D * F / 4
    # Its transpose [F, D] (a backward's operand) counts as the weight too.
    jt = jax.make_jaxpr(lambda x, w: x.astype(jnp.bfloat16) @ w.T.astype(jnp.bfloat16))(
        sds(T, F), sds(D, F)
    )
    assert hbm.phase_bytes(jt, {(D, F): 4})[0] == (4 + 2) * T * F + (4 + 2) * D * F / 4


def test_the_inventory_counts_a_weights_work_per_shard_on_the_mesh():
    """DeepSeek-V3's MoE layer at 8-way expert parallelism: a device casts its 32 of the 256
    experts' weights (XLA's compile of the 5-layer model on 8 GB200s holds bf16[32,7168,2048]
    casts), so the layer's non-matmul bytes fall by most of the expert weights' casts."""
    from tierax.models import apply_overrides
    from tierax.tracing.inventory import model_inventory

    cfg = apply_overrides(
        get_config("deepseek-v3-671b"),
        ["num_layers=2", "first_dense_layers=1", "attention=blockwise"],
    )
    one = {g.name: g for g in model_inventory(cfg, 1, 256, {"expert": 1}).groups}
    ep = {g.name: g for g in model_inventory(cfg, 1, 256, {"expert": 8}).groups}
    # The three expert matrices (256 × 7168 × 2048 each, float32 cast to bfloat16: read 4 + write
    # 2 bytes an element) alone: 7/8 of their forward cast bytes go.
    expert_cast = 3 * 256 * 7168 * 2048 * (4 + 2)
    drop = one["moe"].forward_hbm_bytes_per_layer - ep["moe"].forward_hbm_bytes_per_layer
    assert drop >= expert_cast * 7 / 8
