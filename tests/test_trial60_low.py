"""Issue 60's low items, each a fault a new user hit: refused with the problem and the fix, or
shown as what it is."""

from __future__ import annotations

import json


def test_fp8_rate_without_fp8_gemms_is_refused(cli, tmp_path):
    out = tmp_path / "p.yaml"
    r = cli("plan", "--rate", "fp8_matmul=100", "--out", out)
    assert r.returncode == 2
    assert "--rate fp8_matmul=100: tiny-llama runs no fp8 GEMMs" in r.stderr
    assert "--set quantization=fp8" in r.stderr and not out.exists()
    # with fp8 GEMMs the rate is taken, and it changes the step
    base = json.loads(cli("simulate", "--set", "quantization=fp8", "--json").stdout)
    slow = cli("simulate", "--set", "quantization=fp8", "--rate", "fp8_matmul=1", "--json")
    assert slow.returncode == 0, slow.stderr
    assert json.loads(slow.stdout)["step_time_s"] > base["step_time_s"]


def test_train_config_that_is_not_a_regular_file(cli):
    r = cli("train", "/dev/null")
    assert r.returncode == 2
    assert "'/dev/null' is not a regular file" in r.stderr and "does not exist" not in r.stderr
