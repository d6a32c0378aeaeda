"""The gradient accumulator in host memory (tierax.train.accumulate): on CPU the step gives the
device accumulator's bits; in XLA's deviceless GPU compile the accumulator is a host buffer of the
hand-counted size and leaves the device; the model's host bytes and transfers are XLA's."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from tierax import plan as P
from tierax.errors import TieraxError
from tierax.models import get_config
from tierax.train import step as S
from tierax.xla import compile as C


def decoder_params(cfg) -> int:
    """tiny-llama's decoder parameters by hand."""
    return cfg.num_layers * (
        cfg.d_model * cfg.num_heads * cfg.head_dim * 2  # wq, wo
        + cfg.d_model * cfg.num_kv_heads * cfg.head_dim * 2  # wk, wv
        + cfg.d_model * cfg.mlp_dim * 3  # wi_0, wi_1, wo
        + cfg.d_model * 2  # two norms
    )


def with_accum_on_host(plan: P.Plan) -> P.Plan:
    return dataclasses.replace(plan, state={"decoder": {"grad_accum": "offload"}})


def run(cfg, plan, steps: int, accum: int):
    opt = S.make_optimizer(3e-3)
    graphdef, state = S.init_state(cfg, opt, seed=0, plan=plan)
    fn = S.make_train_step(graphdef, cfg, plan, opt, S.shardings_of(state), grad_accum=accum)
    tokens = S.synthetic_batch(cfg, 8, 16, seed=3).reshape(accum, 8 // accum, 17)
    losses = []
    for _ in range(steps):
        state, metrics = fn(state, tokens)
        losses.append(float(metrics["loss"]))
    return state, losses


def test_host_accumulator_step_is_bit_identical():
    """Two steps of two microbatches: parameters, moments and losses equal the device
    accumulator's bit for bit (the same additions in the same order)."""
    cfg = get_config("tiny-llama")
    base = P.preset("minimal", cfg)
    ref, ref_losses = run(cfg, base, 2, 2)
    got, got_losses = run(cfg, with_accum_on_host(base), 2, 2)
    assert got_losses == ref_losses
    leaves = jax.tree.leaves(ref)
    assert len(leaves) == len(jax.tree.leaves(got)) > 30
    for a, b in zip(leaves, jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_host_accumulator_in_xlas_compile():
    """Deviceless h200, two microbatches: XLA's host temp is the decoder's float32 accumulator
    twice (the layer scan's input and output), counted by hand; the model's host bytes are the
    same; the device temp falls; the host→device copies are the model's (A + 1) accumulators,
    the device→host ones at most that (XLA writes shared zero stacks once) and at least A."""
    cfg = get_config("tiny-llama")
    base = P.preset("minimal", cfg)
    accum = 2
    on_host, _ = C.compile_for_target(
        cfg, with_accum_on_host(base), "h200", microbatch=2, seq=64, grad_accum=accum
    )
    on_device, _ = C.compile_for_target(cfg, base, "h200", microbatch=2, seq=64, grad_accum=accum)
    acc = 4 * decoder_params(cfg)
    assert on_device.host_temp_bytes == 0
    assert on_host.host_temp_bytes == 2 * acc
    assert on_host.predicted["host_bytes"] == 2 * acc
    assert on_device.device_temp_bytes - on_host.device_temp_bytes >= 0.5 * acc
    by = on_host.overlap["by_direction"]
    assert by["h2d"]["transfer_bytes"] == (accum + 1) * acc
    assert accum * acc <= by["d2h"]["transfer_bytes"] <= (accum + 1) * acc


def test_host_accumulator_with_one_microbatch_is_refused():
    cfg = get_config("tiny-llama")
    plan = with_accum_on_host(P.preset("minimal", cfg))
    with pytest.raises(TieraxError, match="accumulates nothing"):
        C.compile_for_target(cfg, plan, "h200", microbatch=2, seq=64)
