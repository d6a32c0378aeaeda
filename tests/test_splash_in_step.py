"""bench/investigations/splash_in_step.py: the splash kernels' rate in a step on the v5e chip
against the microbenchmark's (the cost model's splash table).  Reads the chip's op profiles and the
record; nothing is run on a chip."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORD = json.loads((ROOT / "bench" / "results" / "splash_in_step.json").read_text())


def _script():
    spec = importlib.util.spec_from_file_location(
        "splash_in_step", ROOT / "bench" / "investigations" / "splash_in_step.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_dense_case_by_hand():
    """dense_remat_full: microbatch 8, seq 2048, 16 query heads of 128.  The splash stand-in's
    matmuls (QKᵀ and PV, 2 FLOPs a product each) over the causal blocks of 512 (4 × 4 blocks, 10
    on or below the diagonal): 4 · 8 · 16 · 2048² · 128 · 10/16 FLOPs a forward call."""
    mod = _script()
    case = next(c for c in mod.CASES if c[0] == "dense_remat_full")
    row = mod.case_row(case)
    flops = 4 * 8 * 16 * 2048**2 * 128 * 10 / 16
    assert row["forward_flops_per_call"] == flops
    # the profile: two forward kernels and dq, dkv, each 8 calls a step (8 layers, remat-full)
    assert row["forward_calls_per_step"] == 16 and row["backward_calls_per_step"] == 8
    fwd_ms = 14.527091328000001 + 14.521148776000002
    bwd_ms = 21.809737031333338 + 18.94486971333333
    assert row["in_step_fwd_flops_per_s"] == pytest.approx(16 * flops / (fwd_ms / 1e3))
    assert row["in_step_bwd_flops_per_s"] == pytest.approx(8 * 2.5 * flops / (bwd_ms / 1e3))
    recorded = next(r for r in RECORD["cases"] if r["profile"] == row["profile"])
    assert recorded["forward_flops_per_call"] == flops


def test_the_microbenchmark_rate_is_the_cost_models_at_the_table_point():
    """seq 2048, head dim 128 is a measured point of the table: no interpolation, the record's
    rate is the table's own (bench/results/tpu_kernel_rates.json)."""
    table = json.loads((ROOT / "bench" / "results" / "tpu_kernel_rates.json").read_text())
    point = next(r for r in table["rates"]["splash"] if (r["seq"], r["head_dim"]) == (2048, 128))
    for r in RECORD["cases"]:
        if r["qk_head_dim"] == 128:
            assert r["microbenchmark_fwd_flops_per_s"] == pytest.approx(point["fwd_flops_per_s"])
            assert r["microbenchmark_bwd_flops_per_s"] == pytest.approx(point["bwd_flops_per_s"])


def test_the_ratios_are_the_rates_over_each_other_and_the_conclusion_holds():
    """Every in-step rate is 5-45 % above the microbenchmark's (none within 5 %); against the
    microbenchmark's kernel alone (its own calls profiled) within 10 %."""
    s = RECORD["summary"]
    for r in RECORD["cases"]:
        for w in ("fwd", "bwd"):
            ratio = r[f"in_step_{w}_flops_per_s"] / r[f"microbenchmark_{w}_flops_per_s"]
            assert r[f"{w}_ratio"] == pytest.approx(ratio, rel=1e-12)
            assert 1.05 < r[f"{w}_ratio"] < 1.45, (r["profile"], w)
            assert 0.9 < r[f"{w}_ratio_kernel_alone"] < 1.1, (r["profile"], w)
        assert r["priced_ms_per_step"] > r["kernel_ms_per_step"]
    assert s["ratios_within_tolerance"] == 0 and s["in_step_faster_everywhere"]
    assert s["min_ratio"] == min(r[k] for r in RECORD["cases"] for k in ("fwd_ratio", "bwd_ratio"))


def test_the_record_is_what_the_script_computes_now():
    mod = _script()
    rows = [mod.case_row(c, alone=RECORD["microbenchmark_kernel_alone"]) for c in mod.CASES]
    assert rows == RECORD["cases"]
