"""Calibration's two mappings: a device kind → the target key it is stored under, and a stored
entry → the Rates a plan reads (every key into its own field, checked with distinct numbers so a
key read into the wrong field shows)."""

from __future__ import annotations

import json

import pytest

from tierax import costmodel as cm
from tierax.measure import calibrate


@pytest.mark.parametrize(
    "kind, key",
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 NVL", "h200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),  # "B200" is inside "GB200": a substring test files it as b200
        ("NVIDIA GH200 480GB", "NVIDIA GH200 480GB"),  # a Grace Hopper is not an H200
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),  # no target: stored under its kind
    ],
)
def test_a_gpu_kind_is_stored_under_its_own_target(kind, key):
    assert calibrate.target_key_for("gpu", kind) == key


def test_off_a_gpu_the_key_is_cpu():
    assert calibrate.target_key_for("cpu", "cpu") == "cpu"


@pytest.mark.parametrize(
    "kind, key",
    [
        ("TPU v5 lite", "v5e"),  # what JAX 0.10.2 reports on the lent v5e chip
        ("TPU v5", "v5p"),
        ("TPU v6 lite", "v6e"),
        ("TPU7x", "v7x"),
        ("TPU v4", "TPU v4"),  # no target: stored under its kind, read by none
    ],
)
def test_a_tpu_kind_is_stored_under_its_target(kind, key):
    assert calibrate.target_key_for("tpu", kind) == key


# Distinct values, none a default of the hardware table.
GPU_ENTRY = {
    "created": "hand-cal",
    "matmul_flops_per_s_float32": 1.25e14,
    "matmul_flops_per_s_bfloat16": 6.5e14,
    "d2h_bytes_per_s": 21.0e9,
    "h2d_bytes_per_s": 37.0e9,
    "memory_bytes_per_s": 3.1e12,
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_gpu_calibration_reaches_each_rate_from_its_own_key(dtype):
    r = cm.target_rates("gb200", dtype, calibration={"gb200": GPU_ENTRY})
    assert r.matmul_flops_per_s == GPU_ENTRY[f"matmul_flops_per_s_{dtype}"]
    assert r.d2h_bytes_per_s == 21.0e9  # device → host: the d2h key
    assert r.h2d_bytes_per_s == 37.0e9  # host → device: the h2d key, not the other direction's
    assert r.hbm_bytes_per_s == 3.1e12
    assert r.sources["matmul"].startswith("measured by tierax calibrate (hand-cal)")
    assert r.sources["host_link"].startswith("measured by tierax calibrate (hand-cal)")
    # Stored under another target's key, it is not read: gb200 keeps its datasheet figures.
    other = cm.target_rates("gb200", dtype, calibration={"b200": GPU_ENTRY})
    assert other.d2h_bytes_per_s != 21.0e9 and other.matmul_flops_per_s != r.matmul_flops_per_s


def test_what_calibrate_saves_on_a_gb200_is_what_a_gb200_plan_reads(tmp_path, monkeypatch):
    f = tmp_path / "calibration.json"
    monkeypatch.setenv("TIERAX_CALIBRATION", str(f))
    calibrate.save(dict(GPU_ENTRY), calibrate.target_key_for("gpu", "NVIDIA GB200"))
    assert set(json.loads(f.read_text())) == {"gb200"}
    r = cm.target_rates("gb200", "bfloat16")
    assert (r.h2d_bytes_per_s, r.matmul_flops_per_s) == (37.0e9, 6.5e14)
    assert cm.target_rates("b200", "bfloat16").h2d_bytes_per_s != 37.0e9


CPU_ENTRY = {
    "created": "hand-cal",
    "matmul_flops_per_s_float32": 7.0e10,
    "matmul_flops_per_s_bfloat16": 3.0e10,
    "memory_bytes_per_s": 9.0e9,
    "first_touch_bytes_per_s": 2.5e9,
    "transpose_read_elems_per_s": 4.0e8,
    "transpose_aliased_read_elems_per_s": 1.5e8,
}


def test_a_cpu_calibration_reaches_each_rate_from_its_own_key():
    r = cm.target_rates("cpu", "bfloat16", calibration={"cpu": CPU_ENTRY})
    assert r.matmul_flops_per_s == 3.0e10
    assert cm.target_rates("cpu", "float32", calibration={"cpu": CPU_ENTRY}).matmul_flops_per_s == (
        7.0e10
    )
    assert r.hbm_bytes_per_s == 9.0e9
    assert r.first_touch_bytes_per_s == 2.5e9
    assert r.transpose_read_elems_per_s == 4.0e8
    assert r.transpose_aliased_read_elems_per_s == 1.5e8
