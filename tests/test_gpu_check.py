"""bench/gpu_check.py: its --tiny rehearsal runs the whole GPU-check pipeline on CPU.

No GPU is available to these tests: nothing here says anything about offloading on a GPU.
The default test runs one XLA preset and one preset plan (plus the planner's, when the
planner answers); the slow test runs everything the GPU run would, at tiny size.
"""

import ast
import json
import pathlib
import subprocess
import sys

import pytest

from tierax.report import report as R

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"


def _run(*args, timeout=900):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )


def _check_doc(doc: dict, presets: list[str], plans: list[str]):
    assert doc["schema"] == R.GPU_CHECK_SCHEMA and doc["mode"] == "tiny"
    assert doc["jax_version"] and doc["machine"]["platform"] == "cpu" and doc["command"]
    fit = doc["fit_decision"]
    assert (
        doc["save_all_fits"] is False
        and fit["tried"][-1]["save_all_peak_bytes"] > doc["capacity_bytes"]
    )
    assert "synthetic" in doc["capacity_source"]
    assert doc["link"]["round_trip_equal"] is True and doc["link"]["d2h_bytes_per_s"] > 0
    assert doc["matmul"]["flops_per_s"] > 0
    assert doc["planner"]["status"].startswith("planner: ")
    assert [r["xla_preset"] for r in doc["runs"]] == presets
    for run in doc["runs"]:
        assert "error" not in run, run.get("error")
        if run["xla_preset"] == "lhs-pipelined":
            assert "--xla_gpu_enable_pipelined_host_offloading=true" in run["xla_flags"]
        recs = {r["plan"]: r for r in run["records"]}
        assert set(plans) <= set(recs)
        refused = {
            name
            for name in plans
            if run["xla_preset"] == "lhs-pipelined"
            and not name.endswith("-policy")
            and name.startswith("qkv-offload")
        }
        for name in refused:  # the prefetching scan is not offered with lhs-pipelined
            assert "not offered" in recs[name]["refused"] and recs[name]["step_time_s"] is None
        for name in [n for n in plans if n not in refused]:
            r = recs[name]
            assert r["step_time_s"] > 0 and r["tokens_per_s"] > 0 and r["tflops_per_device"] > 0
            assert (
                r["memory_source"] == "compiled" and r["peak_device_bytes_runtime"] is None
            )  # CPU
            assert r["peak_device_bytes_compiled"] <= doc["capacity_bytes"]
        off = recs["qkv-offload" if "qkv-offload" not in refused else "qkv-offload-policy"]
        # A CPU profile has no transfers and says so; nothing is invented.
        assert off["transfers_observed"] is False and off["exposed_transfer_s"] == 0.0
        assert any("no host↔device transfers" in n for n in off["trace_notes"])
        assert off["verified"] is True
        assert all(v["passed"] for v in run["verify"]) and "verify_errors" not in run
        # The time model against the clock: every plan's prediction beside its measured step,
        # from rates measured in this run (the CPU rehearsal: tierax calibrate's entry).
        for name in [n for n in plans if n not in refused]:
            tm = recs[name]["time_model"]
            assert tm["step_time_s"] > 0 and tm["terms_s"]["compute_s"] > 0
            assert tm["error"] == pytest.approx(tm["step_time_s"] / recs[name]["step_time_s"] - 1)
        assert all(
            "measured by tierax calibrate" in run["model_rates"][k] for k in ("matmul", "hbm")
        )
    summary = doc["time_model"]
    assert "collectives" in summary["note"] and "not checked" in summary["note"]
    assert [p["xla_preset"] for p in summary["presets"]] == presets
    for p in summary["presets"]:
        # A plan the preset refuses (the prefetching scan's offloads under lhs-pipelined) ran no
        # step: nothing to compare.
        ran = [
            n
            for n in plans
            if not (
                p["xla_preset"] == "lhs-pipelined"
                and not n.endswith("-policy")
                and n.startswith("qkv-offload")
            )
        ]
        assert set(ran) <= {r["plan"] for r in p["plans"]}
        assert sorted(p["ranking_measured"]) == sorted(p["ranking_predicted"])


@pytest.mark.slow  # the whole GPU-check pipeline on CPU
def test_tiny_pipeline_one_preset(tmp_path):
    out = tmp_path / "gc.json"
    r = _run(
        "--tiny",
        "--presets",
        "lhs-pipelined",
        "--plans",
        "qkv-offload,qkv-offload@policy",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    _check_doc(doc, ["lhs-pipelined"], ["qkv-offload", "qkv-offload-policy"])
    last = r.stdout.strip().splitlines()
    assert last[-1].startswith("lhs-pipelined") and any(
        "qkv-offload" in line for line in last[-3:]
    )  # table last
    R.build_report([out], tmp_path / "report")  # its output is a report input
    assert (tmp_path / "report" / "gc-throughput-vs-memory.png").exists()


@pytest.mark.slow
def test_tiny_pipeline_everything(tmp_path):
    out = tmp_path / "gc.json"
    r = _run("--tiny", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    _check_doc(
        json.loads(out.read_text()),
        ["none", "lhs-pipelined", "lhs"],
        ["qkv-offload", "remat-full", "minimal"],
    )


def test_bad_arguments_exit_2(tmp_path):
    r = _run("--tiny", "--presets", "fast", "--out", str(tmp_path / "x.json"), timeout=120)
    assert r.returncode == 2 and "unknown XLA preset" in r.stderr
    r = _run("--tiny", "--plans", "save-al", "--out", str(tmp_path / "x.json"), timeout=120)
    assert r.returncode == 2 and "--plans" in r.stderr
    if not pathlib.Path("/proc/driver/nvidia/version").exists():
        r = _run("--out", str(tmp_path / "x.json"), timeout=120)
        assert r.returncode == 2 and "no NVIDIA driver" in r.stderr
    assert not (tmp_path / "x.json").exists()


def test_script_needs_no_package_beyond_the_gpu_image():
    """The GPU machine has no registry: stdlib, jax, numpy, flax and tierax only (others come via
    tierax)."""
    allowed = {"jax", "numpy", "flax", "tierax", "_common"} | set(sys.stdlib_module_names)
    for script in (SCRIPT, SCRIPT.parent / "_common.py"):  # bench/_common: what it shares
        tree = ast.parse(script.read_text())
        roots = {
            (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in (n.names if isinstance(n, ast.Import) else [n])
        }
        assert roots <= allowed, (script.name, roots - allowed)
