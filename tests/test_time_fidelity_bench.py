"""bench/time_fidelity.py's bookkeeping on a hand-made result: errors, quartiles, both rankings,
the fastest-plan check (interquartile ranges overlapping or not), the cores a step got, and the
README table's summary line. Nothing is compiled or timed here."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Run as a script, bench/time_fidelity.py finds bench/_common beside it on sys.path; so here.
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
_spec = importlib.util.spec_from_file_location("time_fidelity", ROOT / "bench" / "time_fidelity.py")
tf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tf)


def _case(plan: str, predicted: float, interleaved: float, times: list[float]) -> dict:
    terms = {k: 0.0 for k in tf.TERMS}
    return {
        "plan": plan,
        "predicted": {"step_time_s": predicted, "breakdown": terms, "fresh_bytes": 50.0},
        "predicted_interleaved": {"step_time_s": interleaved},
        "step_times_s": times,
        "step_cpu_s": [t / 2 for t in times],  # half a core each round
        "step_minor_faults": [1, 2, 3, 4, 5],
        "compiled_memory": {"temp": 100},
    }


def _result(b_times: list[float]) -> dict:
    return {
        "shape": {"name": "hand"},
        "model": {},
        "rates": {},
        "planner": {},
        "load_per_round": [2.0, 3.0],
        "interleaved_calibration": {},
        "interleaved_entries": [],
        "page_size": 4096,
        # a predicted fastest (frozen): measured 1, 2, 3, 4, 5 s; b predicted slower
        "cases": [_case("a", 2.4, 4.0, [1.0, 2.0, 3.0, 4.0, 5.0]), _case("b", 3.0, 3.0, b_times)],
    }


def test_errors_quartiles_and_rankings_by_hand():
    s = tf.summarise(_result([1.5, 1.6, 1.7, 1.8, 1.9]))
    a, b = s["cases"]
    # a: median 3, quartiles (inclusive) 2 and 4; error 2.4 / 3 - 1 = -20 %, interleaved +33 %
    assert (a["measured"]["median"], a["measured"]["q25"], a["measured"]["q75"]) == (3.0, 2.0, 4.0)
    assert a["error"] == pytest.approx(-0.2) and a["error_interleaved"] == pytest.approx(1 / 3)
    assert a["median_minor_faults_bytes"] == 3 * 4096
    assert a["fresh_bytes_over_compiled_temp"] == 0.5
    # measured b (1.7) < a (3.0); frozen predicts a first, interleaved b first
    assert s["ranking_measured"] == ["b", "a"] and s["ranking_predicted"] == ["a", "b"]
    assert s["interleaved"]["ranking_predicted"] == ["b", "a"]
    # frozen picks a, measured fastest b: IQRs 2-4 and 1.6-1.8 do not overlap -> wrong
    assert s["fastest_iqrs_overlap"] is False and s["fastest_ok"] is False
    assert s["interleaved"]["fastest_ok"] is True
    assert tf.cores(a) == pytest.approx(0.5)


def test_overlapping_interquartile_ranges_leave_the_fastest_plan_undecided():
    s = tf.summarise(_result([1.0, 1.5, 2.5, 3.5, 3.6]))  # b: median 2.5, IQR 1.5-3.5
    assert s["fastest_measured"] == "b" and s["fastest_predicted"] == "a"
    assert s["fastest_iqrs_overlap"] is True and s["fastest_ok"] is True


def test_summary_counts_and_the_readme_line():
    doc = {"shapes": [tf.summarise(_result([1.5, 1.6, 1.7, 1.8, 1.9]))], "shapes_not_run": ["x"]}
    doc = tf.with_summary(doc, rounds=5, settle=1)
    fr = doc["summary"]["frozen"]
    # |errors| frozen: a 20 %, b 3 / 1.7 - 1 = 76 %: none within 15 %
    assert fr["within_15_percent"] == 0 and fr["shapes_fastest_ok"] == 0
    assert fr["max_abs_error"] == pytest.approx(3 / 1.7 - 1)
    md = tf.markdown(doc)
    assert "| hand | a | 2.400 | 4.000 | 3.000 (2.000–4.000) | -20.0% | +33.3% | 0.50 |" in md
    assert "Within 15 %: 0 of 2 cases (frozen)" in md and "not run: x" in md


def test_the_interleaved_calibration_takes_a_median_per_rate_and_per_curve_point():
    entries = [
        {"created": "t0", "memory_bytes_per_s": m, "matmul_size_rates_float32": [[40, a], [88, b]]}
        for m, a, b in ((1.0, 10.0, 30.0), (3.0, 20.0, 10.0), (2.0, 40.0, 20.0))
    ]
    got = tf.median_entry(entries)
    assert got == {
        "created": "t0",
        "memory_bytes_per_s": 2.0,
        "matmul_size_rates_float32": [[40, 20.0], [88, 20.0]],
    }


def test_the_ab_bench_drops_only_the_curves_and_counts_errors_by_hand():
    spec = importlib.util.spec_from_file_location(
        "gemm_size_ab", ROOT / "bench" / "investigations" / "gemm_size_ab.py"
    )
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    cal = {"memory_bytes_per_s": 1.0, "matmul_size_rates_float32": [[40, 2.0]]}
    cal |= {"matmul_size_rates_bfloat16": [[40, 3.0]], "matmul_flops_per_s_float32": 4.0}
    assert ab._without_curves(cal) == {"memory_bytes_per_s": 1.0, "matmul_flops_per_s_float32": 4.0}
    cases = [{"e": -0.10}, {"e": 0.20}, {"e": -0.15}, {"e": 0.05}]
    assert ab._errors(cases, "e") == {
        "within_15_percent": 3,
        "median_abs_error": pytest.approx(0.125),
        "max_abs_error": 0.20,
    }
