"""bench/investigations/chip_op_profile.py: a trace's device ops summed by name and by kind, per
step (the chip's profiles under bench/results/chip/profiles are read with it)."""

from __future__ import annotations

import importlib.util
import pathlib

from tierax.measure.trace import Event

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "chip_op_profile", ROOT / "bench" / "investigations" / "chip_op_profile.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ops_summed_by_name_and_kind_per_step():
    mod = _script()
    dev, host = "/device:TPU:0", "/host:CPU"
    ev = [
        Event(dev, "XLA Ops", "fusion.358", 0, 3000.0, {"long_name": "%fusion.358 = ..."}),
        Event(dev, "XLA Ops", "fusion.358", 10, 1000.0),
        Event(dev, "XLA Ops", "fusion.12.v_ref", 20, 500.0),
        Event(dev, "XLA Ops", "scatter_custom_fusion.43", 30, 1500.0),
        Event(host, "python", "fusion.1", 0, 9e6),  # not a device line
    ]
    doc = mod.summarize(ev, steps=2)
    (line,) = doc["lines"]
    assert line["thread"] == "XLA Ops" and line["total_ms_per_step"] == 3.0
    assert line["ops"][0] == {
        "name": "fusion.358",
        "ms_per_step": 2.0,
        "count": 1.0,
        "args": {"long_name": "%fusion.358 = ..."},
    }
    assert line["kinds"] == {"fusion": 2.0, "scatter_custom_fusion": 0.75, "fusion.12.v_ref": 0.25}
    assert mod.kind_of("splash_mha_fwd_no_residuals.7") == "splash_mha_fwd_no_residuals"


def test_a_missing_trace_is_refused_before_anything_is_written(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "ops.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "investigations" / "chip_op_profile.py"),
         "--trace", str(tmp_path / "nope"), "--out", str(out)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert r.returncode == 2 and "no such file or directory" in r.stderr, r.stderr[-1500:]
    assert "Traceback" not in r.stderr and not out.exists()
