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
