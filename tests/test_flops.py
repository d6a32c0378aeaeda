"""Analytic training FLOPs against the matmuls in the traced gradient computation."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from tierax import plan as plan_lib
from tierax.models import abstract_model, get_config
from tierax.models.flops import attention_forward_flops, train_flops
from tierax.tracing import jaxpr_tools
from tierax.train import step as S


def traced_train_matmul_flops(cfg, batch, seq) -> int:
    graphdef, params = nnx.split(abstract_model(cfg))
    loss = S.make_loss_fn(graphdef, plan_lib.to_policies(plan_lib.preset("save-all", cfg), cfg))
    tokens = jax.ShapeDtypeStruct((batch, seq + 1), jnp.int32)
    return jaxpr_tools.matmul_flops(jax.make_jaxpr(jax.value_and_grad(loss))(params, tokens))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-deepseek"])
def test_analytic_flops_equal_traced_matmuls(name):
    cfg = get_config(name)
    batch, seq = 8, 64
    if cfg.family == "deepseek":
        # capacity_factor 1 with tokens·top_k divisible by experts: every expert slot is
        # one activated (token, expert) pair, so executed == activated expert FLOPs.
        cfg = dataclasses.replace(cfg, capacity_factor=1.0)
        assert cfg.capacity(batch * seq) * cfg.num_experts == batch * seq * cfg.num_experts_per_tok
    # The XLA attention computes the full (unmasked) score matrix: compare non-causal.
    analytic = train_flops(cfg, batch, seq, causal=False)
    assert traced_train_matmul_flops(cfg, batch, seq) == pytest.approx(analytic, rel=1e-9)


def test_causal_halves_attention():
    cfg = get_config("llama3-8b")
    full = train_flops(cfg, 1, 8192, causal=False)
    causal = train_flops(cfg, 1, 8192, causal=True)
    assert full - causal == pytest.approx(1.5 * attention_forward_flops(cfg, 1, 8192, causal=False))


def test_llama3_8b_flops_per_token_order_of_magnitude():
    # 6·N per token with N ≈ 7.5 B matmul weights (embedding lookup excluded).
    cfg = get_config("llama3-8b")
    per_token = train_flops(cfg, 1, 1, causal=True)
    assert per_token == pytest.approx(
        6 * (cfg.param_count() - cfg.vocab_size * cfg.d_model), rel=0.001
    )
