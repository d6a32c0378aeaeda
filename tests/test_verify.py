"""Gradient verification (tierax.measure.verify) and the `verify` verb / `bench --verify`.

On XLA:CPU offloading is a no-op, so a pass here checks the remat/save policies; the
offload path itself is checked by the same code on a GPU (bench/gpu_check.py).
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from tierax import cli
from tierax import plan as P
from tierax.errors import TieraxError
from tierax.measure import verify as V
from tierax.models import abstract_model, get_config

MB, SEQ = 2, 16
LEAF = "groups/decoder/attention/wq/kernel"


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-deepseek"])
def every_preset(request):
    """One reference and one compile per (model, preset): save-all reuses the reference."""
    cfg = get_config(request.param)
    return cfg, V.verify_plans(cfg, [P.preset(n, cfg) for n in P.PRESETS], microbatch=MB, seq=SEQ)


def test_every_preset_matches_save_all(every_preset):
    cfg, results = every_preset
    assert [r.plan for r in results] == list(P.PRESETS)
    n_params = len(jax.tree.leaves(nnx.split(abstract_model(cfg))[1]))
    for r in results:
        assert r.passed, f"{cfg.name}/{r.plan}: {r.max_rel_err:.3g} > {r.tolerance} at {r.worst_leaves}"
        assert r.tolerance == 1e-5 and r.max_rel_err <= 1e-5 and r.failing_leaves == ()
        assert r.num_leaves == n_params and len(r.worst_leaves) == 3
        assert r.loss == pytest.approx(r.reference_loss, rel=1e-5) and r.loss > 0
        assert r.model == cfg.name and (r.microbatch, r.seq, r.backend) == (MB, SEQ, "cpu")
        doc = json.loads(json.dumps(r.to_json()))
        assert doc["passed"] is True and doc["reference_plan"] == "save-all"


def test_corrupted_gradient_fails_and_names_the_leaf():
    cfg = get_config("tiny-llama")
    with V.corrupt_gradient(LEAF, amount=0.1):
        r = V.verify_plan(cfg, P.preset("save-all", cfg), microbatch=MB, seq=SEQ)
    assert not r.passed
    assert r.worst_leaves[0].path == LEAF and r.failing_leaves == (LEAF,)
    assert r.max_rel_err == pytest.approx(0.1, rel=1e-4)  # 0.1·max|g| added, relative to max|g_ref|
    assert r.worst_leaves[1].rel_err == 0.0  # nothing else moved
    assert LEAF in repr(r.worst_leaves)  # readable when put in a message
    with pytest.raises(ValueError, match="no leaf 'groups/nope'"):
        with V.corrupt_gradient("groups/nope"):
            V.verify_plan(cfg, P.preset("save-all", cfg), microbatch=MB, seq=SEQ)


# --- the comparison itself, on small pytrees (no model) -----------------------------------------


def _compare(dtype, grads, ref, loss=1.0, ref_loss=1.0):
    cfg = dataclasses.replace(get_config("tiny-llama"), dtype=dtype)
    return V.compare("p", cfg, jnp.float32(loss), grads, jnp.float32(ref_loss), ref, microbatch=1, seq=1, seed=0)


def test_tolerance_follows_the_compute_dtype():
    ref = {"a": jnp.array([1.0, -2.0, 4.0]), "b": jnp.array([[0.5, 0.25]])}
    off_1pct = {"a": ref["a"] + jnp.array([0.0, 0.0, 0.04]), "b": ref["b"]}  # 0.04 / 4 = 1 %
    f32 = _compare("float32", off_1pct, ref)
    bf16 = _compare("bfloat16", off_1pct, ref)
    assert (f32.tolerance, bf16.tolerance) == (1e-5, 2e-2)
    assert f32.max_rel_err == pytest.approx(0.01, rel=1e-5) == bf16.max_rel_err
    assert not f32.passed and f32.failing_leaves == ("a",)
    assert bf16.passed
    with pytest.raises(TieraxError, match="no verify tolerance for dtype 'int8'"):
        V.tolerance_for("int8")


def test_nan_and_loss_mismatch_fail():
    ref = {"a": jnp.array([1.0, 2.0])}
    nan = _compare("bfloat16", {"a": jnp.array([1.0, jnp.nan])}, ref)
    assert not nan.passed and nan.max_rel_err == float("inf") and nan.failing_leaves == ("a",)
    assert nan.to_json()["max_rel_err"] == "inf"  # JSON has no infinity
    loss = _compare("float32", ref, ref, loss=1.5, ref_loss=1.0)
    assert not loss.passed and loss.loss_rel_err == pytest.approx(0.5) and loss.failing_leaves == ()


def test_bad_sizes_and_unknown_plan_are_clear_errors():
    cfg = get_config("tiny-llama")
    with pytest.raises(TieraxError, match="microbatch ≥ 1"):
        V.verify_plan(cfg, P.preset("save-all", cfg), microbatch=0, seq=SEQ)
    with pytest.raises(TieraxError, match="neither a preset"):
        V.verify_plan(cfg, "qkv-ofload", microbatch=MB, seq=SEQ)


# --- CLI ------------------------------------------------------------------------------------


def _cli(monkeypatch, *args):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # JAX already started (conftest): nothing left to configure
    return cli.main(list(args))


def test_verify_verb_exit_0_json(monkeypatch, capsys):
    rc = _cli(monkeypatch, "verify", "--model", "tiny-llama", "--plan", "save-all", "--microbatch", "2", "--seq",
              "16", "--json")
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["passed"] is True
    assert doc["command"].startswith("tierax ") and doc["jax_version"] == jax.__version__
    assert doc["machine"]["platform"] == "cpu" and doc["results"][0]["plan"] == "save-all"


def test_verify_verb_exit_1_names_the_leaf(monkeypatch, capsys):
    with V.corrupt_gradient(LEAF):
        rc = _cli(monkeypatch, "verify", "--model", "tiny-llama", "--plan", "save-all", "--microbatch", "2",
                  "--seq", "16")
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL save-all" in out and LEAF in out


def test_verify_verb_unknown_plan_exits_2(monkeypatch, capsys):
    rc = _cli(monkeypatch, "verify", "--model", "tiny-llama", "--plan", "save-al")
    assert rc == 2 and "neither a preset" in capsys.readouterr().err


def test_bench_verify_failure_runs_no_bench(monkeypatch, tmp_path, capsys):
    out = tmp_path / "bench.json"
    with V.corrupt_gradient(LEAF):
        rc = _cli(monkeypatch, "bench", "--model", "tiny-llama", "--plans", "save-all", "--steps", "1",
                  "--microbatch", "2", "--seq", "16", "--verify", "--out", str(out))
    err = capsys.readouterr().err
    assert rc == 1
    assert "no benchmark was run" in err and LEAF in err
    assert not out.exists()


def test_bench_verify_pass_records_checks_and_memory(monkeypatch, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = _cli(monkeypatch, "bench", "--model", "tiny-llama", "--plans", "save-all", "--steps", "1",
              "--microbatch", "2", "--seq", "16", "--verify", "--out", str(out))
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert [v["plan"] for v in doc["verify"]] == ["save-all"] and doc["verify"][0]["passed"] is True
    rec = doc["records"][0]
    assert rec["memory_source"] == "compiled" and rec["peak_device_bytes_runtime"] is None  # XLA:CPU
    assert rec["peak_device_bytes_compiled"] >= rec["compiled_temp_bytes"] > 0
    assert "memory_stats() is None" in doc["memory_note"]
