"""``tierax plan --maxtext ... --check``: plan MaxText's own program, compile the plan's MaxText
keys with MaxText's own train step (``compile --maxtext``'s compile), correct the model by the
compile's miss and re-plan.

What is checked against what: the loop's last compile against a separate ``compile --maxtext`` of
the emitted file's keys in the environment its header names (the file is what was compiled); the
corrected prediction against that compile (within the loop's 5 %); a budget below MaxText's compiled
peak against the exit status and the file system (exit 2, nothing written, whatever the model
predicted).  The compiles take tens of seconds each on two cores: those tests are slow; the default
suite keeps the refusals made before any work (fast, in this process) — the loop itself is
``plan_check``'s, which tests/test_plan_check*.py cover with tierax's own compile.
"""

from __future__ import annotations

import json

import maxtext_cli as M
import pytest
from test_maxtext_simulate import SMALL, pytestmark  # noqa: F401  (MaxText installed, or skipped)
from test_maxtext_simulate import TINY as TINY_MODEL

from tierax.interop.maxtext_program import emit

# test_maxtext_simulate's 2-layer llama2 block, 2 sequences of 256 per device
TINY = [*TINY_MODEL, "per_device_batch_size=2", "max_target_length=256"]
# SMALL (test_maxtext_simulate's): a step large enough that XLA:TPU's small buffers are not its peak
TOLERANCE = 0.05  # plan --check's agreement bound


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--check", "--target", "v5p"], "give --devices"),
        (["--check-iterations", "2", "--no-check", "--target", "v5p", "--devices", "4"],
         "add --check"),
        (["--check", "--no-check", "--target", "v5p", "--devices", "4"], "give one"),
        (["--check", "--target", "vr200", "--devices", "4"], "projection"),
        (["--check", "--sweep", "1,2", "--target", "v5p", "--devices", "4"], "--sweep"),
        (
            ["--check", "--emit", "maxtext", "--json", "--target", "v5p", "--devices", "4"],
            "give --out FILE",
        ),
    ],
)  # fmt: skip
def test_check_refusals_before_any_work(tmp_path, capsys, extra, needle):
    """Refused in this process before MaxText loads or JAX starts: exit 2, --out not written."""
    from tierax.cli import main

    out = tmp_path / "mt.yml"
    to = [] if "give --out FILE" in needle else ["--out", str(out)]
    assert main(["plan", "--maxtext", M.base_yml(), *TINY, *extra, *to]) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()


def _check(tmp_path, user, target, devices, *extra):
    out = tmp_path / "mt.yml"
    r = M.tierax(
        "plan", "--maxtext", M.base_yml(), *user, "--target", target, "--devices", str(devices),
        "--check", "--emit", "maxtext", "--out", str(out), "--json", *extra,
    )  # fmt: skip
    return r, out


def _compile_emitted(user, out, target, devices) -> dict:
    """``compile --maxtext`` of the emitted file's keys over the user's, in its header's
    environment (a separate process: JAX starts afresh there)."""
    import os
    import subprocess
    import sys

    from tierax.interop.maxtext_program.emit import command_overrides, read_overrides

    text = out.read_text()
    keys = command_overrides(user, read_overrides(text))
    env = M.env()
    for name, value in emit.read_environment(text).items():
        if name in ("XLA_FLAGS", "LIBTPU_INIT_ARGS"):
            env[name] = f"{os.environ.get(name, '')} {value}".strip()
    r = subprocess.run(
        [sys.executable, "-m", "tierax.cli", "compile", "--maxtext", M.base_yml(), *keys,
         "--target", target, "--devices", str(devices), "--json"],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    return M.json_of(r)


def _converged(r) -> dict:
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout[r.stdout.index("{") :])
    assert doc["converged"] and 1 <= doc["compiles"] <= len(doc["iterations"]) <= 4
    last = doc["iterations"][-1]
    assert last["xla_fits"] and last["xla_peak_bytes"] <= doc["budget_bytes"]
    assert abs(last["predicted_peak_bytes"] / last["xla_peak_bytes"] - 1) <= TOLERANCE
    assert doc["fitted_iteration"] == len(doc["iterations"])
    return doc


@pytest.mark.slow  # MaxText compiles of a 2-layer step, then one of the emitted file
def test_gpu_check_converges_and_the_file_is_what_was_compiled(tmp_path):
    r, out = _check(tmp_path, TINY, "h200", 2)
    doc = _converged(r)
    text = out.read_text()
    flags = emit.read_environment(text)["XLA_FLAGS"]
    assert flags == "--xla_gpu_enable_latency_hiding_scheduler=true"
    assert f"plan --check: {doc['compiles']} MaxText compile(s)" in text
    xla = _compile_emitted(TINY, out, "h200", 2)
    assert xla["device_peak_bytes"] == doc["iterations"][-1]["xla_peak_bytes"]
    assert xla["fits"] and xla["attention"] == "cudnn_flash_jax"


@pytest.mark.slow  # traces of what would fit (vocabulary tilings, smaller batches)
def test_a_budget_below_the_models_need_exits_2_writing_nothing(tmp_path):
    """41 MiB: on this tiny step the model needs more than MaxText's compile (its fixed GPU terms
    are most of the step: XLA:GPU's 32 MiB GEMM workspace among them), so no plan fits before any
    compile: exit 2 naming what was tried (vocabulary tiling, smaller batches); --out absent.  The
    loop's compiled-over-budget path is tests/test_plan_check_iterations.py's (the same loop) and
    bench/results/maxtext_plan_check.json's llama3-8b case."""
    r, out = _check(tmp_path, TINY, "h200", 2, "--budget-gib", "0.04")
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "compile 1" not in r.stderr  # refused before MaxText compiled anything
    assert "num_vocab_tiling up to 64 nor a smaller per_device_batch_size fits" in r.stderr
    assert not out.exists()


@pytest.mark.slow  # MaxText compiles of a 2-layer step for 4 v5p chips, then the file's
def test_tpu_check_converges_and_the_file_is_what_was_compiled(tmp_path):
    r, out = _check(tmp_path, SMALL, "v5p", 4)
    doc = _converged(r)
    text = out.read_text()
    assert (
        "--xla_tpu_enable_windowed_einsum_for_reduce_scatter=false"
        in emit.read_environment(text)["LIBTPU_INIT_ARGS"]
    )
    xla = _compile_emitted(SMALL, out, "v5p", 4)
    assert xla["device_peak_bytes"] == doc["iterations"][-1]["xla_peak_bytes"]


def test_the_header_environment_reads_back_quoted_values():
    """An emitted file's ``export`` lines (values shell-quoted, as a user pastes them) read back
    as the environment; other comment lines and the keys are not part of it."""
    text = (
        "# MaxText overrides written by tierax plan --maxtext for ...\n"
        "# Environment (XLA reads it when the backend starts):\n"
        "#   export LIBTPU_INIT_ARGS='--xla_tpu_a=true --xla_tpu_b=4'\n"
        "#   export XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true\n"
        "#   (the flags the prediction relied on)\n"
        "remat_policy: custom\n"
    )
    assert emit.read_environment(text) == {
        "LIBTPU_INIT_ARGS": "--xla_tpu_a=true --xla_tpu_b=4",
        "XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true",
    }
