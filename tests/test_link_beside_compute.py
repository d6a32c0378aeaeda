"""bench/investigations/link_beside_compute.py's records: the chip check's plans priced again with
the host link measured beside compute (the cost model's v5e default) against the round trip's.

Reads the records and the model's rates; nothing is compiled or measured."""

from __future__ import annotations

import json
import pathlib

import pytest

from tierax import costmodel as cm
from tierax.measure import accel_rates

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "bench" / "results"
DOC = json.loads((RESULTS / "link_beside_compute_repredicted.json").read_text())


def test_the_record_prices_with_the_models_current_host_link():
    r = cm.target_rates("v5e", "bfloat16", calibration={})
    assert DOC["host_link_bytes_per_s"] == pytest.approx(r.d2h_bytes_per_s, rel=1e-12)
    assert DOC["round_trip_bytes_per_s"] > DOC["host_link_bytes_per_s"]


def test_the_link_beside_compute_brings_the_copy_bound_plan_within_ten_percent():
    rows = {(p["model"], p["microbatch"], p["plan"]): p for p in DOC["plans"]}
    bound = rows[("mla-moe", 16, "deepseek-offload")]
    assert abs(bound["error_round_trip_link"]) > 0.10 >= abs(bound["error"])
    for p in DOC["plans"]:  # a slower link only adds exposed copies: no plan gets faster
        assert p["predicted_s"] >= p["predicted_round_trip_link_s"] - 1e-12, p
        assert p["error"] == pytest.approx(p["predicted_s"] / p["measured_s"] - 1, rel=1e-12)
    assert DOC["worst_abs_error"] < DOC["worst_abs_error_round_trip_link"]


def test_the_slope_rate_is_the_bytes_moved_over_the_added_time():
    """By hand: 8 layers store 7 values and load 7 (the last stays on the device), so a layer of
    B bytes moves 14·B; added times on a line of 1 s per 1e10 bytes give 1e10 bytes/s whatever the
    intercept (the compute that hid the first bytes)."""
    rows = [
        {"layer_bytes": b, "added_s": 0.003 + 14 * b / 1e10} for b in (2**27, 2**28, 3 * 2**27)
    ]
    assert accel_rates.slope_rate(rows, 8) == pytest.approx(1e10, rel=1e-9)
    assert accel_rates.slope_rate(rows[:1], 8) is None  # one size: no slope
    flat = [dict(r, added_s=0.004) for r in rows]  # hidden at every size: nothing measured
    assert accel_rates.slope_rate(flat, 8) is None


def test_calibrate_takes_the_rate_beside_compute_and_the_round_trip_only_without_one(monkeypatch):
    trip = {"d2h_bytes_per_s": 15.9e9, "h2d_bytes_per_s": 15.9e9}
    monkeypatch.setattr(accel_rates, "step_link_rates", lambda **kw: trip)
    rows = [{"layer_bytes": b, "added_s": 14 * b / 13.6e9} for b in (2**27, 2**28)]
    monkeypatch.setattr(accel_rates, "beside_compute_row", lambda shape, mib, calls: rows.pop(0))
    link = accel_rates.host_link_rates()
    assert link["rate_from"] == "beside compute"
    assert link["d2h_bytes_per_s"] == link["h2d_bytes_per_s"] == pytest.approx(13.6e9)
    assert link["round_trip"] is trip
    rows[:] = [{"layer_bytes": b, "added_s": 0.0} for b in (2**27, 2**28)]  # all hidden
    link = accel_rates.host_link_rates()
    assert link["rate_from"] == "round trip" and link["d2h_bytes_per_s"] == 15.9e9


def test_an_attention_layer_is_causal_attention_over_its_heads():
    """bench/tpu_kernel_sweep.py's link-beside-attention layers: each step is causal attention of
    [tokens, width] read as sequences of width / head dim query heads over half as many kv heads
    (a group's first query head its key and value), as a softmax by hand computes it."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    seq, hd, t = 128, 64, 256
    h = jax.random.normal(jax.random.key(0), (t, 4 * hd), jnp.float32).astype(jnp.bfloat16)
    got = np.asarray(accel_rates._attention_step(h, seq, hd, True), np.float32)
    x = np.asarray(h, np.float32).reshape(t // seq, seq, 2, 2, hd)  # [B, S, kv, group, d]
    want = np.empty_like(x)
    mask = np.tril(np.ones((seq, seq), bool))
    for b in range(t // seq):
        for k in range(2):
            kv = x[b, :, k, 0]
            for g in range(2):
                s = x[b, :, k, g] @ kv.T / np.sqrt(hd)
                s = np.where(mask, s, -np.inf)
                p = np.exp(s - s.max(-1, keepdims=True))
                want[b, :, k, g] = (p / p.sum(-1, keepdims=True)) @ kv
    np.testing.assert_allclose(got, want.reshape(t, 4 * hd), atol=3e-2, rtol=3e-2)
