"""Gradient verification (tierax.measure.verify) and the `verify` verb / `bench --verify`.

On XLA:CPU offloading is a no-op, so a pass here checks the remat/save policies; the
offload path itself is checked by the same code on a GPU (bench/gpu_check.py).
"""

import collections
import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from tierax import plan as plan_lib
from tierax.errors import TieraxError
from tierax.measure import verify as V
from tierax.models import abstract_model, get_config

MB, SEQ = 2, 16
OTHER_PRESETS = [
    n for n in plan_lib.PRESETS if n != V.REFERENCE_PLAN
]  # save-all against itself: the CLI tests


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-deepseek"])
def every_preset(request):
    """One reference and one compile per (model, preset)."""
    cfg = get_config(request.param)
    return cfg, V.verify_plans(
        cfg, [plan_lib.preset(n, cfg) for n in OTHER_PRESETS], microbatch=MB, seq=SEQ
    )


def test_every_preset_matches_save_all(every_preset):
    cfg, results = every_preset
    assert [r.plan for r in results] == OTHER_PRESETS
    n_params = len(jax.tree.leaves(nnx.split(abstract_model(cfg))[1]))
    for r in results:
        assert r.passed, (
            f"{cfg.name}/{r.plan}: {r.max_rel_err:.3g} > {r.tolerance} at {r.worst_leaves}"
        )
        assert r.tolerance == 1e-5 and r.max_rel_err <= 1e-5 and r.failing_leaves == ()
        assert r.num_leaves == n_params and len(r.worst_leaves) == 3
        assert r.loss == pytest.approx(r.reference_loss, rel=1e-5) and r.loss > 0
        assert r.model == cfg.name and (r.microbatch, r.seq, r.backend) == (MB, SEQ, "cpu")
        doc = json.loads(json.dumps(r.to_json()))
        assert doc["passed"] is True and doc["reference_plan"] == "save-all"


# --- genuinely wrong programs ------------------------------------------------------------------
#
# The decoder wraps a group's layer body in jax.checkpoint(policy) and scans it; a plan with any
# remat or offload gets that path, save-all (the reference) does not.  These helpers swap what that
# path compiles to for a wrong program, so the plan's own program computes wrong gradients while the
# reference stays right, as when XLA mis-addressed an offloaded scan residual (openxla/xla#46231).


class _Proxy:
    """``jax`` (or ``jax.lax``) with some attributes replaced."""

    def __init__(self, base, **over):
        self._base, self._over = base, over

    def __getattr__(self, name):
        return self._over[name] if name in self._over else getattr(self._base, name)


class _Rematted:
    def __init__(self, body):
        self.body = body


def _stacked_residual_scan(offset: int):
    """A scan whose forward stores every layer's input in a stacked buffer (what an offloaded
    residual is)
    and whose backward for layer i reads slot ``i − offset`` of it: 0 is right, 1 is the
    neighbour's."""

    def scan(body, init, xs):
        step = lambda c, x: body(c, x)[0]  # noqa: E731

        @jax.custom_vjp
        def run(c, xs):
            return jax.lax.scan(lambda c, x: (step(c, x), None), c, xs)[0]

        def fwd(c, xs):
            out, inputs = jax.lax.scan(lambda c, x: (step(c, x), c), c, xs)
            return out, (inputs, xs)

        def bwd(res, g):
            inputs, xs = res

            def back(g, i):
                x_in = inputs[jnp.maximum(i - offset, 0)]
                _, vjp = jax.vjp(step, x_in, jax.tree.map(lambda a: a[i], xs))
                return vjp(g)

            return jax.lax.scan(back, g, jnp.arange(inputs.shape[0]), reverse=True)

        run.defvjp(fwd, bwd)
        return run(init, xs), None

    return scan


def _wrong_scan_iteration(monkeypatch, offset=1):
    from tierax.models import decoder

    scan = _stacked_residual_scan(offset)

    def lax_scan(f, init, xs, **kw):
        return (
            scan(f.body, init, xs) if isinstance(f, _Rematted) else jax.lax.scan(f, init, xs, **kw)
        )

    monkeypatch.setattr(
        decoder,
        "jax",
        _Proxy(
            jax, checkpoint=lambda body, **kw: _Rematted(body), lax=_Proxy(jax.lax, scan=lax_scan)
        ),
    )


def _lossy_custom_vjp(monkeypatch):
    """A layer variant whose custom VJP back-propagates through its input as stored in bfloat16."""
    from tierax.models import decoder

    def checkpoint(body, **kw):
        @jax.custom_vjp
        def layer(c, x):
            return body(c, x)

        def fwd(c, x):
            return body(c, x), (c.astype(jnp.bfloat16), x)

        def bwd(res, g):
            c16, x = res
            return jax.vjp(body, c16.astype(jnp.float32), x)[1](g)

        layer.defvjp(fwd, bwd)
        return layer

    monkeypatch.setattr(decoder, "jax", _Proxy(jax, checkpoint=checkpoint))


UPSTREAM = "groups/decoder/"  # leaves whose gradients pass through the scanned layers' backward
DOWNSTREAM = (
    "head/kernel",
    "final_norm/scale",
)  # computed before it: right whatever the layers' VJP


def _fails_upstream_only(r):
    assert not r.passed and r.max_rel_err > 100 * r.tolerance
    assert r.failing_leaves and all(
        p.startswith(UPSTREAM) or p == "embed/embedding" for p in r.failing_leaves
    )
    assert any(p.startswith(UPSTREAM) for p in r.failing_leaves)
    assert not set(DOWNSTREAM) & set(r.failing_leaves)
    assert (
        r.loss == r.reference_loss
    )  # the forward is right; only the backward reads the wrong residual


def test_the_stacked_residual_program_is_right_when_it_reads_the_right_slot(monkeypatch):
    """Control: the same hand-written backward with offset 0 passes, so a failure below is the
    offset."""
    _wrong_scan_iteration(monkeypatch, offset=0)
    cfg = get_config("tiny-llama")
    r = V.verify_plan(cfg, plan_lib.preset("minimal", cfg), microbatch=MB, seq=SEQ)
    assert r.passed, r.worst_leaves


def test_residual_read_from_the_neighbouring_iteration_fails_and_names_the_leaves(monkeypatch):
    _wrong_scan_iteration(monkeypatch, offset=1)
    cfg = get_config("tiny-llama")
    r = V.verify_plan(
        cfg, plan_lib.preset("minimal", cfg), microbatch=MB, seq=SEQ
    )  # the reference has no remat path
    _fails_upstream_only(r)
    assert r.worst_leaves[0].path in r.failing_leaves


@pytest.mark.parametrize(
    "model", ["tiny-llama", pytest.param("tiny-deepseek", marks=pytest.mark.slow)]
)
def test_wrong_custom_vjp_fails_and_names_the_leaves(monkeypatch, model):
    _lossy_custom_vjp(monkeypatch)
    cfg = get_config(model)
    # The lossy variant replaces jax.checkpoint, which runs the layer under XLA's offload policy.
    r = V.verify_plan(
        cfg,
        dataclasses.replace(plan_lib.preset("qkv-offload", cfg), mechanism="policy"),
        microbatch=MB,
        seq=SEQ,
    )
    if model == "tiny-llama":
        _fails_upstream_only(r)
    else:
        assert not r.passed and r.failing_leaves
        assert not set(DOWNSTREAM) & set(r.failing_leaves)
        assert {p.split("/")[1] for p in r.failing_leaves if p.startswith("groups/")} == {
            "dense",
            "moe",
        }


def test_verify_has_no_module_level_caches():
    mutable = {
        k: type(v).__name__
        for k, v in vars(V).items()
        if not k.startswith("__")
        and isinstance(v, (dict, list, set, collections.OrderedDict))
        and k != "TOLERANCES"
    }
    assert mutable == {}


# --- the comparison itself, on small pytrees (no model) -----------------------------------------


def _compare(dtype, grads, ref, loss=1.0, ref_loss=1.0):
    cfg = dataclasses.replace(get_config("tiny-llama"), dtype=dtype)
    return V.compare(
        "p", cfg, jnp.float32(loss), grads, jnp.float32(ref_loss), ref, microbatch=1, seq=1, seed=0
    )


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
        V.verify_plan(cfg, plan_lib.preset("save-all", cfg), microbatch=0, seq=SEQ)
    with pytest.raises(TieraxError, match="neither a preset"):
        V.verify_plan(cfg, "qkv-ofload", microbatch=MB, seq=SEQ)


# --- CLI ------------------------------------------------------------------------------------


def test_verify_verb_exit_0_json(cli):
    r = cli(
        "verify",
        "--model",
        "tiny-llama",
        "--plan",
        "save-all",
        "--microbatch",
        "2",
        "--seq",
        "16",
        "--json",
    )
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["passed"] is True
    # the verb's own command, not this process's (pytest's) arguments
    assert doc["command"] == (
        "tierax verify --model tiny-llama --plan save-all --microbatch 2 --seq 16 --json"
    )
    assert doc["jax_version"] == jax.__version__
    assert doc["machine"]["platform"] == "cpu" and doc["results"][0]["plan"] == "save-all"


def test_verify_verb_exit_1_names_the_leaf(cli, monkeypatch):
    _wrong_scan_iteration(monkeypatch)
    r = cli(
        "verify",
        "--model",
        "tiny-llama",
        "--plan",
        "minimal",
        "--microbatch",
        "2",
        "--seq",
        "16",
    )
    out = r.stdout
    assert r.returncode == 1 and "FAIL minimal" in out
    assert (
        UPSTREAM in out and "head/kernel" not in out
    )  # the wrong leaves are named, the right ones are not


def test_verify_verb_unknown_plan_exits_2(cli):
    r = cli("verify", "--model", "tiny-llama", "--plan", "save-al")
    assert r.returncode == 2 and "neither a preset" in r.stderr


def test_bench_verify_failure_runs_no_bench(cli, monkeypatch, tmp_path):
    out = tmp_path / "bench.json"
    _wrong_scan_iteration(monkeypatch)
    r = cli(
        "bench",
        "--model",
        "tiny-llama",
        "--plans",
        "minimal",
        "--steps",
        "1",
        "--microbatch",
        "2",
        "--seq",
        "16",
        "--verify",
        "--out",
        str(out),
    )
    err = r.stderr
    assert r.returncode == 1
    assert "no benchmark was run" in err and UPSTREAM in err
    assert not out.exists()


@pytest.mark.slow  # a bench run with verify
def test_bench_verify_pass_records_checks_and_memory(cli, tmp_path):
    out = tmp_path / "bench.json"
    r = cli(
        "bench",
        "--model",
        "tiny-llama",
        "--plans",
        "save-all",
        "--steps",
        "1",
        "--microbatch",
        "2",
        "--seq",
        "16",
        "--verify",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert [v["plan"] for v in doc["verify"]] == ["save-all"] and doc["verify"][0]["passed"] is True
    rec = doc["records"][0]
    assert (
        rec["memory_source"] == "compiled" and rec["peak_device_bytes_runtime"] is None
    )  # XLA:CPU
    assert rec["peak_device_bytes_compiled"] >= rec["compiled_temp_bytes"] > 0
    assert "memory_stats() is None" in doc["memory_note"]


@pytest.mark.slow  # every program compiled sharded
def test_verify_on_a_mesh_runs_every_program_sharded_on_it(cli, monkeypatch):
    """verify takes the mesh every other verb takes; the plan and save-all both run on it."""
    seen = []
    original = V.compiled_step

    def spy(graphdef, plan, cfg, params, tokens, mesh=None):
        seen.append((plan.name, dict(mesh.shape) if mesh is not None else None))
        return original(graphdef, plan, cfg, params, tokens, mesh)

    monkeypatch.setattr(V, "compiled_step", spy)
    r = cli(
        "verify",
        "--model",
        "tiny-llama",
        "--devices",
        "8",
        "--mesh",
        "fsdp=4,tensor=2",
        "--plan",
        "qkv-offload",
        "--seq",
        "16",
        "--json",
    )
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["passed"] is True, doc
    want = {"data": 1, "fsdp": 4, "tensor": 2, "expert": 1}
    assert doc["mesh"] == want
    assert seen == [("save-all", want), ("qkv-offload", want)]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (
            ["--mesh", "fsdp=4,tensor=2", "--microbatch", "6"],
            "(the global batch) 6 is not divisible",
        ),
        (["--mesh", "fsdp=2,tensor=4"], "num_kv_heads=2 is not divisible by tensor=4"),
    ],
)
def test_verify_refuses_a_mesh_the_model_or_batch_cannot_take(cli, monkeypatch, args, fragment):
    monkeypatch.setattr(V, "compiled_step", lambda *a, **k: pytest.fail("compiled before refusing"))
    r = cli("verify", "--model", "tiny-llama", "--plan", "minimal", *args)
    assert r.returncode == 2
    assert fragment in r.stderr
