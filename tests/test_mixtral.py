"""The Mixtral-style MoE (a Llama config with ``num_experts``): softmax routing, top-k, the routed
SwiGLU experts, against a dense reference written here; the published shape's parameter counts;
every preset's gradients equal save-all's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tierax import names as N
from tierax import plan as P
from tierax.errors import TieraxError
from tierax.models import apply_overrides, get_config
from tierax.models import moe as moe_lib
from tierax.train import step as S

CFG = get_config("tiny-mixtral")


def test_published_mixtral_parameter_counts():
    # "Mixtral of Experts" (Jiang et al. 2024): 46.7 B parameters, 12.9 B active per token
    cfg = get_config("mixtral-8x7b")
    assert cfg.param_count() == pytest.approx(46.7e9, rel=0.002)
    assert cfg.activated_param_count() == pytest.approx(12.9e9, rel=0.002)
    (g,) = cfg.layer_groups()
    assert set(N.MOE_NAMES) <= set(g.activations) and N.MLPWI_0 not in g.activations


def test_softmax_routing_by_hand():
    # one token, 4 experts: logits 1, 3, 2, 0 → softmax, top-2 = experts 1 and 2, gates
    # renormalised over the two: e^3 / (e^3 + e^2), e^2 / (e^3 + e^2)
    router = jnp.eye(4, dtype=jnp.float32)
    x = jnp.array([[1.0, 3.0, 2.0, 0.0]])
    cfg = apply_overrides(CFG, ["d_model=4"])
    gates, experts = moe_lib.route(x, router, cfg)
    assert experts.tolist() == [[1, 2]]
    e3, e2 = np.exp(3.0), np.exp(2.0)
    np.testing.assert_allclose(gates, [[e3 / (e3 + e2), e2 / (e3 + e2)]], rtol=1e-6)


def _dense_reference(x_TD, router, wi_0, wi_1, wo, k):
    """Every token through each of its top-k experts, weighted by its renormalised softmax gate."""
    probs = jax.nn.softmax(x_TD @ router, axis=-1)
    top, idx = jax.lax.top_k(probs, k)
    gates = top / top.sum(-1, keepdims=True)
    out = jnp.zeros_like(x_TD)
    for j in range(k):
        e = idx[:, j]
        h = jax.nn.silu(jnp.einsum("td,tdf->tf", x_TD, wi_0[e])) * jnp.einsum(
            "td,tdf->tf", x_TD, wi_1[e]
        )
        out = out + gates[:, j : j + 1] * jnp.einsum("tf,tfd->td", h, wo[e])
    return out


def test_routed_experts_equal_the_dense_reference_when_nothing_is_dropped():
    cfg = apply_overrides(CFG, ["capacity_factor=4.0"])  # capacity = all tokens: nothing dropped
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    T, D, F, E = 12, cfg.d_model, cfg.mlp_dim, cfg.num_experts
    x = jax.random.normal(keys[0], (1, T, D), jnp.float32)
    router = jax.random.normal(keys[1], (D, E), jnp.float32) * 0.3
    wi_0 = jax.random.normal(keys[2], (E, D, F), jnp.float32) * D**-0.5
    wi_1 = jax.random.normal(keys[3], (E, D, F), jnp.float32) * D**-0.5
    wo = jax.random.normal(keys[4], (E, F, D), jnp.float32) * F**-0.5
    got = moe_lib.routed_experts(x, router, wi_0, wi_1, wo, cfg)[0]
    want = _dense_reference(x[0], router, wi_0, wi_1, wo, cfg.num_experts_per_tok)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.fixture(scope="module")
def save_all_reference():
    """The save-all step's loss and gradients, computed once for every preset below."""
    graphdef, params = S.init_params(CFG, seed=1)
    tokens = S.synthetic_batch(CFG, 2, 16, seed=2)
    ref_loss, ref = S.loss_and_grads(graphdef, CFG, P.preset("save-all", CFG), params, tokens)
    return graphdef, params, tokens, ref_loss, ref


def _rel(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-30))


@pytest.mark.parametrize("preset", [p for p in P.PRESETS if p != "save-all"])
@pytest.mark.slow  # a gradient compile per preset (test_verify runs every preset by default)
def test_gradients_of_every_preset_equal_save_all(preset, save_all_reference):
    graphdef, params, tokens, ref_loss, ref = save_all_reference
    loss, got = S.loss_and_grads(graphdef, CFG, P.preset(preset, CFG), params, tokens)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert max(jax.tree.leaves(jax.tree.map(_rel, got, ref))) <= 1e-5


# moe_impl=ragged: dropless grouped GEMMs (jax.lax.ragged_dot), the DeepSeek family's code.  At
# tiny-mixtral's capacity factor (experts / top-k) the capacity form drops nothing, so the ragged
# step under any plan equals the capacity form's save-all step: a second implementation of the
# same layer.  The default suite runs one remat plan (every name recomputed, the grouped GEMMs'
# backward through the remat); every preset: the slow battery (tests/test_plan_battery.py).
RAGGED = apply_overrides(CFG, ["moe_impl=ragged"])


@pytest.mark.parametrize(
    "preset",
    ["remat-full", pytest.param("qkv-offload", marks=pytest.mark.slow)],
)
def test_ragged_mixtral_gradients_equal_the_capacity_save_all_step(preset, save_all_reference):
    _, params, tokens, ref_loss, ref = save_all_reference
    # capacity = every token's slot in every expert: the capacity form drops nothing
    routed = tokens.shape[0] * (tokens.shape[1] - 1)
    assert CFG.capacity(routed) == routed
    graphdef, same = S.init_params(RAGGED, seed=1)  # the model object carries moe_impl
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), same, params))
    loss, got = S.loss_and_grads(graphdef, RAGGED, P.preset(preset, RAGGED), params, tokens)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert max(jax.tree.leaves(jax.tree.map(_rel, got, ref))) <= 1e-5


def test_bad_expert_settings_name_the_fix():
    with pytest.raises(TieraxError, match="num_experts_per_tok=9"):
        apply_overrides(CFG, ["num_experts_per_tok=9"])
    with pytest.raises(TieraxError, match="num_experts must be a non-negative"):
        apply_overrides(CFG, ["num_experts=-1"])
    with pytest.raises(TieraxError, match="moe_impl='megablox' is not a MoE implementation"):
        apply_overrides(CFG, ["moe_impl=megablox"])
    with pytest.raises(TieraxError, match="mxfp8 runs the expert GEMMs of moe_impl=capacity"):
        apply_overrides(CFG, ["moe_impl=ragged", "quantization=mxfp8"])
    with pytest.raises(TieraxError, match="this config is dense .num_experts=0.; leave moe_impl"):
        apply_overrides(CFG, ["moe_impl=ragged", "num_experts=0"])


def test_ragged_inventory_holds_the_sorted_rows_and_counts_their_flops():
    """The inventory of ragged Mixtral against hand counts: the grouped GEMMs' residuals are
    tokens × top-k rows (the capacity form's: experts × capacity slots), and one layer's forward
    matmul FLOPs are the projections, attention's two score matmuls, the router and three expert
    GEMMs on those rows."""
    from tierax.tracing import inventory as inv_lib

    mb, seq = 2, 16
    T, D, F = mb * seq, CFG.d_model, CFG.mlp_dim
    E, k, H, K, hd = CFG.num_experts, CFG.num_experts_per_tok, CFG.num_heads, CFG.num_kv_heads, 16
    assert CFG.head_dim == hd and CFG.attention == "xla"
    (cap,) = inv_lib.model_inventory(CFG, mb, seq).groups
    (rag,) = inv_lib.model_inventory(RAGGED, mb, seq).groups
    size_c = {a.name: a.bytes_per_layer for a in cap.activations}
    size_r = {a.name: a.bytes_per_layer for a in rag.activations}
    C = CFG.capacity(T)
    for name, width in ((N.MOE_MLPWI_0, F), (N.MOE_MLPWI_1, F), (N.MOE_MLPWO, D)):
        assert size_r[name] == T * k * width * 4, name  # float32
        assert size_c[name] == E * C * width * 4, name
    assert {n: b for n, b in size_r.items() if not n.startswith("moe_")} == {
        n: b for n, b in size_c.items() if not n.startswith("moe_")
    }
    projections = 2 * T * D * (H * hd + 2 * K * hd) + 2 * T * H * hd * D
    scores = 2 * 2 * mb * H * seq * seq * hd  # Q·Kᵀ and P·V, the whole square (xla attention)
    router = 2 * T * D * E
    assert rag.forward_flops_per_layer == projections + scores + router + 3 * 2 * T * k * D * F
    assert cap.forward_flops_per_layer == projections + scores + router + 3 * 2 * E * C * D * F
