"""bench/investigations/chip_schedule.py's records: the chip's own compile of each case against a
deviceless compile under the chip's libtpu (0.0.42.1) and under this machine's (0.0.52).

What the investigation's answer rests on, read from the records (nothing compiled here): the
chip's schedule is the deviceless 0.0.42.1 one copy for copy, and the planner's head-dim-64 plan
gives its backward loads a fraction of the layer backward that qkv-offload's loads span."""

from __future__ import annotations

import json
import pathlib

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "bench" / "results"


def _record(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _loads(case: dict) -> list[tuple[int, int]]:
    """(kernels, instructions) between each host load's start and done, in program order."""
    return [
        (c["matmuls_or_kernels_between"], c["instructions_between"])
        for c in case["copies"]
        if c["direction"] == "h2d"
    ]


def _schedule(case: dict) -> list[tuple]:
    return [
        (c["direction"], c["matmuls_or_kernels_between"], c["instructions_between"])
        for c in case["copies"]
    ]


def test_the_chips_schedule_is_the_deviceless_one_under_its_libtpu():
    chip = _record("chip/chip_schedule.json")
    local = _record("chip_schedule_deviceless_libtpu_0.0.42.1.json")
    assert chip["device_kind"] == "TPU v5 lite" and chip["jax_version"] == "0.10.2"
    assert {c["libtpu"] for c in local["cases"]} == {"0.0.42.1"}
    assert len(chip["cases"]) == len(local["cases"]) == 3
    for on_chip, here in zip(chip["cases"], local["cases"], strict=True):
        assert (on_chip["case"], on_chip["plan"]) == (here["case"], here["plan"])
        assert on_chip["copies"], on_chip["case"]  # host copies on the chip: offload is real
        assert _schedule(on_chip) == _schedule(here)
        assert on_chip["device_peak_bytes"] == here["device_peak_bytes"]


def test_the_planners_head_dim_64_plan_gets_a_fraction_of_a_layer_backward_to_load_in():
    for name in (
        "chip/chip_schedule.json",
        "chip_schedule_deviceless_libtpu_0.0.42.1.json",
        "chip_schedule_deviceless_libtpu_0.0.52.json",
    ):
        cases = {(c["case"], c["plan"]): c for c in _record(name)["cases"]}
        planned = _loads(cases[("dense-hd64", "planned_hd64_mb8.yaml")])
        qkv = _loads(cases[("dense-hd64", "qkv-offload")])
        layer = max(k for k, _ in qkv)  # the loop's loads: a whole layer backward between
        assert layer >= 20, name
        in_loop = [k for k, _ in planned if k > 3]  # the loop's, not the three before it
        assert in_loop and max(in_loop) <= layer // 3, (name, planned, qkv)
        # the deepseek-offload plan's loop loads span the layer backward
        mla = _loads(cases[("mla-moe", "deepseek-offload")])
        assert sum(k >= 24 for k, _ in mla) >= 4, (name, mla)


def test_the_copy_timeline_places_the_loads_on_the_chips_clock():
    """chip_schedule.py --timeline: each copy's start and done on the chip's clock (the op
    profile's times over the chip's own compile).  The head-dim-64 plan's loads start 19 ms into
    their 41 ms loop body and one waits ~13 ms; the pair moves slower than the model's
    link, while deepseek-offload's five loads together move faster than it, from a start 14 ms
    into their body: both plans' waits come from where the loads start as much as from the link."""
    from tierax import costmodel as cm

    link = cm.target_rates("v5e", "bfloat16", calibration={}).h2d_bytes_per_s
    doc = _record("chip/copy_timeline.json")
    hd64, moe = doc["timelines"]
    assert (hd64["case"], moe["case"]) == ("dense-hd64", "mla-moe")
    for tl in doc["timelines"]:
        for c in tl["copies"]:
            assert c["start_ms"] <= c["done_ms"] and c["wait_ms"] >= 0
            assert c["host_bytes_tiled"] >= c["bytes"]
    q = next(c for c in hd64["copies"] if c["direction"] == "h2d" and c["value"] == "query_proj")
    assert q["host_bytes_tiled"] == 2 * q["bytes"]  # head dim 64 held at the 128-lane tile
    (h64,) = [g for g in hd64["together"] if g["direction"] == "h2d"]
    body = next(c["body_ms"] for c in hd64["copies"] if c["computation"] == h64["computation"])
    assert h64["first_start_ms"] > 0.4 * body and h64["waits_ms"] > 10
    assert h64["bytes_per_s"] < link
    (m,) = [g for g in moe["together"] if g["direction"] == "h2d" and g["copies"] == 5]
    assert m["first_start_ms"] > 10 and m["waits_ms"] > 10 and m["bytes_per_s"] > link
    total = m["bytes_tiled"] / (m["last_done_ms"] - m["first_start_ms"]) * 1e3
    assert m["bytes_per_s"] == total


def _investigation(name: str):
    """A bench/investigations script imported as a module (its bench siblings on the path)."""
    import importlib
    import sys

    root = RESULTS.parents[1]
    for d in ("bench", "bench/investigations"):
        if str(root / d) not in sys.path:
            sys.path.insert(0, str(root / d))
    return importlib.import_module(name)


def test_the_copy_timeline_record_is_what_the_script_computes_now():
    chip_schedule = _investigation("chip_schedule")
    doc = _record("chip/copy_timeline.json")
    assert doc["timelines"] == [chip_schedule.timeline(p, c) for p, c in chip_schedule.TIMELINES]


def test_the_scheduler_flags_record_is_what_the_script_joins_from_its_runs():
    scheduler_flags = _investigation("scheduler_flags")
    doc = _record("chip/scheduler_flags.json")
    rows = scheduler_flags.join(RESULTS / "chip" / "scheduler_flags")["rows"]
    assert doc["rows"] == rows
    # the default set's loads are the chip's own compile's (chip_schedule.json, case 0)
    chip = _record("chip/chip_schedule.json")["cases"][0]
    assert rows[0]["deviceless"]["loads_kernels_between"] == [
        c["matmuls_or_kernels_between"]
        for c in chip["copies"]
        if c["direction"] == "h2d" and c["computation"] != "ENTRY"
    ]


def test_loosening_the_schedulers_memory_guard_lengthens_the_loads_but_does_not_save_the_plan():
    """What the answer rests on: each looser option set gives the loads more of the layer
    backward and runs the plan faster at a higher compiled peak; under every set remat-full (the
    same program each time, within 0.1 %) is faster still."""
    rows = _record("chip/scheduler_flags.json")["rows"]
    loads = [min(r["deviceless"]["loads_kernels_between"]) for r in rows]
    plan = [r["chip"]["plan_s"] for r in rows]
    peak = [r["chip"]["plan_peak_device_bytes_compiled"] for r in rows]
    assert loads == sorted(loads) and loads[-1] >= 3 * loads[0]
    assert plan == sorted(plan, reverse=True) and peak == sorted(peak)
    base = rows[0]["chip"]["remat_full_s"]
    for r in rows:
        assert abs(r["chip"]["remat_full_s"] / base - 1) < 1e-3
        assert r["chip"]["plan_over_remat_full"] > 1.03
