"""Gathers and scatters priced apart from their bytes (XLA:TPU runs them at a cost per index and
scatters below HBM bandwidth: a MoE layer's on the v5e chip, bench/results/chip/profiles): the
tracer counts them by hand, the step prices them at the target's measured rates and nowhere else,
and the microbenchmark that measures the rates runs."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from tierax import costmodel as cm
from tierax.costmodel.fixed import fixed_terms
from tierax.tracing import hbm

R, D, N_IDX = 64, 32, 48


def _traced(idx):
    """forward: rows of x gathered by ``idx``, then element lookups of a 100-long table; backward:
    the rows' gradient scatter-added back (the gather's transpose)."""
    table = jnp.arange(100, dtype=jnp.int32)

    def f(x):
        rows = x[idx]  # N_IDX row indices
        k = table[idx % 100]  # N_IDX element indices
        return jnp.sum(rows * k[:, None].astype(x.dtype))

    def fwd_bwd(x, ct):
        y, vjp = jax.vjp(f, x)
        return y, vjp(hbm.marker(ct))

    return jax.make_jaxpr(fwd_bwd)(
        jax.ShapeDtypeStruct((R, D), jnp.float32), jax.ShapeDtypeStruct((), jnp.float32)
    )


def test_gathers_and_scatters_counted_by_hand():
    idx = jnp.arange(N_IDX, dtype=jnp.int32) % R
    (fwd_n, fwd_b), (bwd_n, bwd_b) = hbm.phase_indexed(_traced(idx))
    assert fwd_n == 2 * N_IDX and fwd_b == 0  # two gathers, nothing scattered
    assert bwd_n == N_IDX and bwd_b == N_IDX * D * 4  # the rows' gradient, float32


def test_a_scatter_inside_a_scan_counts_every_trip():
    def f(x):
        def body(c, i):
            return c.at[i % R].add(1.0), None

        return jax.lax.scan(body, x, jnp.arange(5))[0]

    j = jax.make_jaxpr(f)(jax.ShapeDtypeStruct((R, D), jnp.float32))
    (n, b), _ = hbm.phase_indexed(j)
    assert n == 5 and b == 5 * D * 4


@pytest.fixture(scope="module")
def moe_program():
    from tierax.models import apply_overrides, get_config
    from tierax.tracing.model_program import program_of

    cfg = apply_overrides(get_config("tiny-mixtral"), ["attention=xla"])
    return program_of(cfg, 2, 64)


def test_the_step_prices_them_at_the_targets_rates_and_only_there(moe_program):
    """tiny-mixtral's step on v5e: its compute grows by exactly the layers' forward and backward
    indices at the per-index cost and their scattered bytes at the scatter rate; with the rates
    zero (every target but the measured TPU) it does not."""
    inv = moe_program.inventory
    g = inv.groups[0]
    (fn, fb), (bn, bb) = g.forward_indexed_per_layer, g.backward_indexed_per_layer
    assert fn > 0 and bb > 0  # the routing gathers, the combine's scatter-add gradient
    v5e = cm.target_rates("v5e", "float32")
    assert v5e.index_op_s > 0 and v5e.scatter_bytes_per_s > 0
    zero = dataclasses.replace(v5e, index_op_s=0.0, scatter_bytes_per_s=0.0)
    with_rates = fixed_terms(moe_program, v5e, "lhs").compute_s
    without = fixed_terms(moe_program, zero, "lhs").compute_s
    by_hand = ((fn + bn) * v5e.index_op_s + (fb + bb) / v5e.scatter_bytes_per_s) * g.num_layers
    assert with_rates - without == pytest.approx(by_hand, rel=1e-9)
    # the forward's share of them lengthens the compute the stores hide under: the group's, and
    # a store's own window in the forward's FLOPs' proportion (costmodel.terms.store_window_s)
    fwd_s = (fn * v5e.index_op_s + fb / v5e.scatter_bytes_per_s) * g.num_layers
    win = [cm.group_terms(inv, r, "lhs", "prefetch")[0].d2h_window_s for r in (v5e, zero)]
    assert win[0] - win[1] == pytest.approx(fwd_s, rel=1e-9)
    a = {x.name: x for x in g.activations}["value_proj"]  # stored in its own layer
    own = [cm.terms.store_window_s(a, g, r, "prefetch") for r in (v5e, zero)]
    share = 1 - a.flops_made_per_layer / g.forward_flops_per_layer
    assert own[0] - own[1] == pytest.approx(fwd_s * share, rel=1e-9)
    for target in ("h100", "v5p"):  # no measured gather rates there
        r = cm.target_rates(target, "float32")
        assert r.index_op_s == 0 and r.scatter_bytes_per_s == 0


def test_a_dense_layer_has_none():
    from tierax.models import apply_overrides, get_config
    from tierax.tracing.model_program import program_of

    prog = program_of(apply_overrides(get_config("tiny-llama"), ["attention=xla"]), 2, 64)
    g = prog.inventory.groups[0]
    assert g.forward_indexed_per_layer == (0.0, 0.0) == g.backward_indexed_per_layer


def test_the_microbenchmark_measures_both_rates(monkeypatch):
    """The microbenchmark's code at small sizes (its gathers and scatters at the chip's sizes take
    seconds on XLA:CPU, and what is checked here does not depend on them): one gather, every
    scatter case in order, both rates positive."""
    from tierax.measure import accel_rates

    cases = ((512, 2048), (2048, 512))  # as the real cases: a dispatch and a combine's gradient
    monkeypatch.setattr(accel_rates, "INDEX_LOOKUPS", 4096)
    monkeypatch.setattr(accel_rates, "INDEX_SOURCE", 2048)
    monkeypatch.setattr(accel_rates, "SCATTER_CASES", cases)
    monkeypatch.setattr(accel_rates, "SCATTER_WIDTH", 128)
    r = accel_rates.indexed_rates(calls=2)
    assert r["index_op_s"] > 0 and r["scatter_bytes_per_s"] > 0
    assert r["gather"]["indices"] == 4096 and r["gather"]["source"] == 2048
    assert [(s["update_rows"], s["buffer_rows"], s["width"]) for s in r["scatters"]] == [
        (512, 2048, 128),
        (2048, 512, 128),
    ]
