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


@pytest.mark.parametrize("preset", [p for p in P.PRESETS if p != "save-all"])
@pytest.mark.slow  # a gradient compile per preset (test_verify runs every preset by default)
def test_gradients_of_every_preset_equal_save_all(preset, save_all_reference):
    graphdef, params, tokens, ref_loss, ref = save_all_reference
    loss, got = S.loss_and_grads(graphdef, CFG, P.preset(preset, CFG), params, tokens)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)

    def rel(a, b):
        return float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-30))

    assert max(jax.tree.leaves(jax.tree.map(rel, got, ref))) <= 1e-5


def test_bad_expert_settings_name_the_fix():
    with pytest.raises(TieraxError, match="num_experts_per_tok=9"):
        apply_overrides(CFG, ["num_experts_per_tok=9"])
    with pytest.raises(TieraxError, match="num_experts must be a non-negative"):
        apply_overrides(CFG, ["num_experts=-1"])
