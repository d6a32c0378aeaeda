"""The console script, run as a user runs it."""

import json
import shutil
import subprocess
import sys

import pytest


def tierax(*args, check=None):
    exe = shutil.which("tierax") or None
    cmd = [exe] if exe else [sys.executable, "-m", "tierax.cli"]
    return subprocess.run(
        cmd + list(args), capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
    )


def test_help_on_every_verb():
    from tierax.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "verb")
    verbs = sorted(sub.choices)
    assert len(verbs) >= 14 and {"train", "compile", "plan", "report", "profile", "verify"} <= set(
        verbs
    )
    top = tierax("--help")
    assert top.returncode == 0
    for verb in verbs:
        assert verb in top.stdout
        r = tierax(verb, "--help")
        assert r.returncode == 0 and "usage: tierax " + verb in r.stdout, (verb, r.stderr)
        assert len(r.stdout) > 200, f"{verb} --help says almost nothing"


def test_python_dash_m_tierax_runs_the_command():
    """``python -m tierax`` (a source tree on a machine where the package is not installed, as on a
    lent TPU machine) is the ``tierax`` command."""
    r = subprocess.run(
        [sys.executable, "-m", "tierax", "models", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    assert "tiny-llama" in json.loads(r.stdout)


def test_models_json_lists_named_configs():
    r = tierax("models", "--json")
    assert r.returncode == 0
    data = json.loads(r.stdout)
    assert data["deepseek-v3-671b"]["param_count"] > 6.7e11


def test_plans_show_yaml_is_a_loadable_plan(tmp_path):
    r = tierax("plans", "--model", "tiny-deepseek", "--show", "deepseek-offload", "--yaml")
    assert r.returncode == 0, r.stderr
    f = tmp_path / "plan.yaml"
    f.write_text(r.stdout)
    again = tierax("plans", "--model", "tiny-deepseek", "--show", str(f), "--yaml")
    assert again.returncode == 0 and again.stdout == r.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["bench", "--plans", "save-al"], "neither a preset"),
        (["bench", "--model", "tiny-lama"], "unknown model 'tiny-lama'"),
        (["bench", "--mesh", "data=2,fsdp=x"], "--mesh"),
        (
            ["bench", "--devices", "2", "--mesh", "data=1,fsdp=4"],
            "has 4 devices but --devices is 2",
        ),
        (["bench", "--xla-preset", "fast"], "unknown XLA preset"),
        (["plans", "--model", "tiny-llama", "--show", "deepseek-offload-typo"], "neither a preset"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(args, fragment, cli):
    # The first case through the installed command (the process's own exit status); the others,
    # refused before JAX is configured, in this process (``cli``: what ``main`` returns).
    r = tierax(*args) if args[:2] == ["bench", "--plans"] else cli(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert fragment in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_plan_file_exits_2(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("plan: bad\ngroups:\n  decoder:\n    query_projj: offload\n")
    r = tierax("bench", "--plans", str(f))
    assert (
        r.returncode == 2 and "no activation 'query_projj' (did you mean 'query_proj'?)" in r.stderr
    )
    f.write_text("plan: bad\ngroups:\n  decoder:\n    query_proj: offlaod\n")
    r = tierax("bench", "--plans", str(f))
    assert r.returncode == 2 and "device, offload, remat" in r.stderr


@pytest.mark.slow  # a bench run through the CLI
def test_bench_json_and_record(tmp_path):
    out = tmp_path / "results" / "b.json"
    r = tierax(
        "bench",
        "--model",
        "tiny-llama",
        "--plans",
        "save-all,qkv-offload",
        "--steps",
        "2",
        "--microbatch",
        "2",
        "--seq",
        "16",
        "--json",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    records = json.loads(r.stdout)["records"]  # --json prints the whole tierax.bench/1 record
    keys = {
        "plan",
        "step_time_s",
        "tokens_per_s",
        "tflops_per_device",
        "mfu",
        "compiled_temp_bytes",
        "device_activation_bytes",
        "host_activation_bytes",
        "remat_activation_bytes",
        "loss",
    }
    assert [rec["plan"] for rec in records] == ["save-all", "qkv-offload"]
    for rec in records:
        assert keys <= set(rec)
        assert rec["step_time_s"] > 0 and 0 < rec["mfu"] and rec["compiled_temp_bytes"] > 0
    save, off = records
    assert save["host_activation_bytes"] == 0 and save["remat_activation_bytes"] == 0
    assert off["host_activation_bytes"] > 0 and off["remat_activation_bytes"] > 0
    assert off["compiled_temp_bytes"] < save["compiled_temp_bytes"]
    doc = json.loads(out.read_text())
    assert (
        doc["schema"] == "tierax.bench/1"
        and doc["jax_version"]
        and doc["command"].startswith("tierax bench")
    )
    assert doc["model"]["name"] == "tiny-llama" and doc["records"] == records
