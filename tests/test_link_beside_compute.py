"""bench/investigations/link_beside_compute.py's records: the chip check's plans priced again with
the host link measured beside compute (the cost model's v5e default) against the round trip's.

Reads the records and the model's rates; nothing is compiled or measured."""

from __future__ import annotations

import json
import pathlib

import pytest

from tierax import costmodel as cm

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
