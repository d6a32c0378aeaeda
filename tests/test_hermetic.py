"""The suite runs hermetically (tests/conftest.py): the home directory, the caches and the
calibration file are the run's own temporary ones, in this process and in every CLI process a test
starts; the calibration file's path follows the environment when it changes, not the one seen at
import."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tierax import costmodel as cm
from tierax.measure import calibrate


def _in_run_tmp(path) -> bool:
    return pathlib.Path(path).resolve().is_relative_to(
        pathlib.Path(os.environ["TIERAX_TESTS_TMP"]).resolve()
    )


def test_home_caches_and_calibration_are_the_runs_own():
    real = pathlib.Path(os.environ["TIERAX_TESTS_REAL_HOME"])
    assert pathlib.Path.home() != real and _in_run_tmp(pathlib.Path.home())
    for key in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "MPLCONFIGDIR", "JAX_COMPILATION_CACHE_DIR"):
        assert _in_run_tmp(os.environ[key]), key
    assert _in_run_tmp(cm.calibration_file())
    # nothing wrote the run's default calibration: a test that needs CPU rates takes calibrated_cpu
    assert not cm.calibration_file().exists()


def test_a_cli_process_inherits_the_runs_home_and_calibration():
    code = (
        "import pathlib; from tierax.costmodel import rates; "
        "print(pathlib.Path.home()); print(rates.calibration_file())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    home, cal = out.stdout.split()
    assert _in_run_tmp(home) and _in_run_tmp(cal)
    assert pathlib.Path(cal) == cm.calibration_file()


def test_the_calibration_file_follows_the_environment(tmp_path, monkeypatch):
    """TIERAX_CALIBRATION set after import moves both what calibrate writes and what a plan reads
    (a path fixed at import wrote the file the caller had moved, e.g. a user's real one)."""
    entry = {"created": "hand", "matmul_flops_per_s_float32": 3.0e11, "memory_bytes_per_s": 2e10}
    for name in ("a.json", "b.json"):
        monkeypatch.setenv("TIERAX_CALIBRATION", str(tmp_path / name))
        saved = calibrate.save(dict(entry), key="cpu")
        assert saved["file"] == str(tmp_path / name)
        assert json.loads((tmp_path / name).read_text())["cpu"]["created"] == "hand"
        assert cm.target_rates("cpu", "float32").matmul_flops_per_s == 3.0e11
    monkeypatch.setenv("TIERAX_CALIBRATION", str(tmp_path / "none.json"))
    assert cm.load_calibration() == {}


# -m slow (the fixture's measurement, tierax calibrate's CPU stages at their shapes, takes half a
# minute, and no default test needs this machine's rates): tests/test_audit_gaps_calibrate.py maps
# every measurement to the rate target 'cpu' reads, tests/test_time_model.py runs each CPU
# microbenchmark, tests/test_calibrate.py reads an entry's sources as measured.
@pytest.mark.slow
def test_calibrated_cpu_is_measured_by_calibrate(calibrated_cpu):
    """The fixture's rates are a real ``calibrate`` entry for this machine, and target 'cpu' reads
    them."""
    entry = json.loads(calibrated_cpu.read_text())["cpu"]
    assert entry["device_kind"] == "cpu" and entry["microbenchmarks"]
    rates = cm.target_rates("cpu", "bfloat16")
    assert rates.matmul_flops_per_s == entry["matmul_flops_per_s_bfloat16"] > 0
    assert rates.sources["matmul"].startswith(f"measured by tierax calibrate ({entry['created']})")
