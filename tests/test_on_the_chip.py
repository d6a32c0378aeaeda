"""tierax on an accelerator: which platform a verb starts, bench holding one plan at a time and
recording the plans the device refuses, what MFU divides by, XLA:TPU's memory figures, a TPU's
calibrated rates in the cost model, and the chip check's CPU rehearsal.

The figures of XLA:TPU's memory analysis come from a real chip (bench/results/tpu_probe.json);
tests that need a TPU run only where one is present and skip elsewhere (CI has none)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from tierax import costmodel as cm
from tierax.launch import flags
from tierax.measure import bench, memory

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROBE = json.loads((ROOT / "bench" / "results" / "tpu_probe.json").read_text())
ON_A_TPU = flags.Accelerators.present().tpu
chip_only = pytest.mark.skipif(not ON_A_TPU, reason="needs a TPU (this machine has none)")

NONE = flags.Accelerators(nvidia=False, tpu=False)
TPU = flags.Accelerators(nvidia=False, tpu=True)
GPU = flags.Accelerators(nvidia=True, tpu=False)


# --- the platform a verb starts ------------------------------------------------------------


@pytest.mark.parametrize(
    "env, found, host_devices, run_step, expected",
    [
        ("", TPU, False, True, None),  # a verb that runs a step, on a TPU machine: JAX's choice
        ("", GPU, False, True, None),
        ("", NONE, False, True, "cpu"),  # nothing else there
        ("", TPU, True, True, "cpu"),  # --devices N: host devices, as asked
        ("", TPU, False, False, "cpu"),  # simulate/plan trace only: never take the chip
        ("tpu", NONE, True, True, None),  # JAX_PLATFORMS is the user's: JAX reads it
        ("cpu", TPU, False, True, None),
    ],
)
def test_the_platform_is_the_accelerator_for_a_step(env, found, host_devices, run_step, expected):
    got = flags.choose_platforms(
        env_platforms=env, found=found, host_devices=host_devices, run_step=run_step
    )
    assert got == expected


@pytest.mark.parametrize(
    "env, found, expected",
    [
        ("", flags.Accelerators(nvidia=False, tpu=True), True),  # beside a chip: its own compile
        ("cpu", flags.Accelerators(nvidia=False, tpu=True), False),  # asked for deviceless
        ("", flags.Accelerators(nvidia=False, tpu=False), False),  # no chip: deviceless
        ("", flags.Accelerators(nvidia=True, tpu=False), False),  # a GPU is no TPU
    ],
)
def test_a_tpu_target_compiles_on_the_attached_chip(env, found, expected):
    assert flags.compiles_on_attached_tpu(env_platforms=env, found=found) is expected


def test_a_tpu_target_compiles_deviceless_without_a_chip(monkeypatch):
    """Here (no TPU) the compile start is the deviceless one: the CPU platform for JAX."""
    from tierax import launch

    calls = []
    monkeypatch.setattr(launch, "start_deviceless_tpu", lambda *a: calls.append(a))
    monkeypatch.setattr(flags.Accelerators, "present", classmethod(lambda cls: cls(False, False)))
    assert launch.start_tpu_compile("none", "v5litepod-1") is False
    assert calls == [("none", "v5litepod-1")]


def test_a_tpu_is_found_by_its_device_files(monkeypatch):
    """The lent v5e showed its chip as /dev/vfio/3 beside the container's /dev/vfio/vfio, and no
    /dev/accel* (bench/results/tpu_probe.json)."""
    files = {"/dev/accel*": [], "/dev/vfio/*": PROBE["facts"]["dev_vfio"]}
    monkeypatch.setattr(flags.glob, "glob", lambda pat: files.get(pat, []))
    assert flags._has_tpu()
    files["/dev/vfio/*"] = ["/dev/vfio/vfio"]  # the VFIO container alone is no chip
    assert not flags._has_tpu()
    files["/dev/accel*"] = ["/dev/accel0"]
    assert flags._has_tpu()


def test_uses_accelerator_follows_jax_platforms():
    from tierax import launch

    assert launch.uses_accelerator({"JAX_PLATFORMS": "tpu,cpu"})
    assert not launch.uses_accelerator({"JAX_PLATFORMS": "cpu"})


def test_bench_starts_on_the_cpu_here_and_says_so(tmp_path):
    """No accelerator here: the first line names the CPU and the record's machine too."""
    out = tmp_path / "b.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tierax.cli",
            "bench",
            "--plans",
            "remat-full",
            "--steps",
            "1",
            "--microbatch",
            "1",
            "--seq",
            "16",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[0].startswith("running on cpu: 1 × cpu")
    doc = json.loads(out.read_text())
    assert doc["machine"]["platform"] == "cpu" and doc["mfu_basis"] == "measured"
    assert doc["not_run"] == []


# --- bench: one plan at a time, refused plans recorded ------------------------------------------


def _tiny():
    from tierax.models import get_config

    return get_config("tiny-llama")


def _state_bytes(cfg) -> int:
    from tierax.train import step as step_lib

    opt = step_lib.make_optimizer(mu_dtype=cfg.mu_dtype)
    _, state = step_lib.init_state(cfg, opt)
    n = sum(x.nbytes for x in jax.tree.leaves(state))
    bench.free(state)
    return n


def test_bench_holds_one_plans_state_at_a_time():
    """Bytes of live arrays at every progress callback stay near one plan's state (the old bench
    prepared every plan first: with the two plans here, two states at once, above the 1.5 bound)."""
    from tierax import plan as plan_lib

    cfg = _tiny()
    one = _state_bytes(cfg)
    base = sum(x.nbytes for x in jax.live_arrays())
    seen = []

    def progress(_what, _n):
        seen.append(sum(x.nbytes for x in jax.live_arrays()) - base)

    plans = [plan_lib.preset(p, cfg) for p in ("save-all", "remat-full")]
    records, _, not_run = bench.run_bench(
        cfg, plans, steps=3, microbatch=1, seq=16, warmup=1, progress=progress
    )
    assert [r.plan for r in records] == ["save-all", "remat-full"] and not not_run
    assert all(len(r.step_times_s) == 3 for r in records)
    assert max(seen) < 1.5 * one, (max(seen), one)


def test_a_refused_plan_is_recorded_and_the_others_run(monkeypatch):
    """XLA:CPU never runs out of device memory, so the chip's refusal (its own message) is raised
    for one plan's compile; that plan is recorded as not fitting, the others are timed."""
    from tierax import plan as plan_lib
    from tierax.measure import harness

    cfg = _tiny()
    real = harness.prepare
    msg = next(r["error"] for r in PROBE["steps"] if "error" in r)  # the chip's own words

    def prepare(build, batch, **kw):
        fn, state = build()
        if fn is SENTINEL["fn"]:
            raise RuntimeError(msg)
        return real(lambda: (fn, state), batch, **kw)

    SENTINEL = {"fn": None}
    from tierax.train import step as step_lib

    make = step_lib.make_train_step

    def make_step(graphdef, cfg, plan, *a, **k):
        fn = make(graphdef, cfg, plan, *a, **k)
        if plan.name == "save-all":
            SENTINEL["fn"] = fn
        return fn

    monkeypatch.setattr(harness, "prepare", prepare)
    monkeypatch.setattr(step_lib, "make_train_step", make_step)
    plans = [plan_lib.preset(p, cfg) for p in ("save-all", "remat-full")]
    records, _, not_run = bench.run_bench(cfg, plans, steps=2, microbatch=1, seq=16, warmup=1)
    assert [r.plan for r in records] == ["remat-full"]
    assert [(n.plan, n.stage, n.out_of_memory) for n in not_run] == [("save-all", "compile", True)]
    assert "exceeds available HBM" in not_run[0].error


def test_out_of_memory_is_told_from_other_faults():
    oom = next(r["error"] for r in PROBE["steps"] if "error" in r)
    assert bench.is_out_of_memory(RuntimeError(oom))
    assert bench.is_out_of_memory(
        RuntimeError("RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to reserve")
    )
    assert not bench.is_out_of_memory(ValueError("Incompatible shapes for broadcasting"))


def test_mfu_divides_by_the_datasheet_peak_where_the_target_is_known():
    p = bench.Peaks(180e12, "GEMMs", 197e12, "Cloud TPU v5e datasheet")
    assert p.mfu_basis == 197e12
    assert bench.Peaks(3e12, "matmul").mfu_basis == 3e12


def test_max_microbatch_is_refused_on_the_cpu(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "tierax.cli", "bench", "--plans", "remat-full", "--max-microbatch"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 2 and "XLA:CPU" in r.stderr and "TPU or GPU" in r.stderr


# --- XLA:TPU's memory figures, from the chip -------------------------------------------------


class _Analysis:
    def __init__(self, fields: dict):
        self.__dict__.update(fields)


class _Compiled:
    def __init__(self, fields: dict):
        self._a = _Analysis(fields)

    def memory_analysis(self):
        return self._a


def _probe_step(plan: str) -> dict:
    return next(r for r in PROBE["steps"] if r["plan"] == plan)


def test_tpu_peak_is_xlas_own_and_fits_the_chip():
    """remat-full at microbatch 8 ran on the chip (15.75 GiB): arguments + output + temp − alias
    says it could not; XLA:TPU's peak_memory_in_bytes says it fits, and equals the allocator's
    peak after the run within 0.1 %."""
    step = _probe_step("remat-full")
    cm_tpu = memory.compiled_memory(_Compiled(step["analysis"]), platform="tpu")
    cm_gpu = memory.compiled_memory(_Compiled(step["analysis"]), platform="gpu")
    limit = step["stats_after"]["bytes_limit"]
    assert cm_gpu.peak > limit >= cm_tpu.peak
    assert abs(cm_tpu.peak / step["stats_after"]["peak_bytes_in_use"] - 1) < 1e-3
    assert cm_tpu.peak_source == memory.XLA_TPU_PEAK


def test_donated_host_state_is_counted_once():
    """Moments and masters on the host: the step reads them and writes their new values into the
    same buffers (host alias).  The host holds arguments + temp; the old sum counted the donated
    state twice (1.5× the planner's figure on the chip)."""
    a = _probe_step("remat-full+state-host")["analysis"]
    c = memory.compiled_memory(_Compiled(a), platform="tpu")
    assert c.host_total == a["host_argument_size_in_bytes"] + a["host_temp_size_in_bytes"]
    assert (
        c.host_total
        < a["host_argument_size_in_bytes"]
        + a["host_output_size_in_bytes"]
        + a["host_temp_size_in_bytes"]
    )


# --- a TPU's calibrated rates in the cost model ------------------------------------------------

ENTRY = {
    "created": "hand-made",
    "matmul_flops_per_s_bfloat16": 181e12,
    "matmul_size_rates_bfloat16": [[128, 61e12], [1024, 170e12], [2048, 181e12]],
    "fused_attention_fwd_flops_per_s": 56e12,
    "fused_attention_bwd_flops_per_s": 65e12,
    "splash_attention": [
        [2048, 128, 56e12, 65e12],
        [8192, 128, 100e12, 87e12],
        [2048, 64, 36e12, 32e12],
    ],
    "d2h_bytes_per_s": 3.5e9,
    "h2d_bytes_per_s": 13e9,
}


def test_calibrated_tpu_rates_replace_the_guesses():
    r = cm.target_rates("v5e", "bfloat16", calibration={"v5e": ENTRY})
    guess = cm.target_rates("v5e", "bfloat16", calibration={})
    assert r.matmul_flops_per_s == 181e12
    # without a calibration: the rate measured on a v5e chip (tests/test_tpu_kernel_rates.py)
    assert guess.matmul_flops_per_s != 181e12 and "bench/results/" in guess.sources["matmul"]
    assert (r.d2h_bytes_per_s, r.h2d_bytes_per_s) == (3.5e9, 13e9)
    assert r.fused_attention_fwd_flops_per_s == 56e12
    # by size: log-linear between the measured points
    assert r.matmul_rate_at(128) == 61e12 and r.matmul_rate_at(4096) == 181e12
    mid = r.matmul_rate_at(362)  # half way in log between 128 and 1024
    assert 61e12 < mid < 170e12 and mid == pytest.approx((61e12 + 170e12) / 2, rel=0.01)
    for k in ("matmul", "host_link", "fused_attention", "matmul_by_size"):
        assert "measured by tierax calibrate" in r.sources[k], k
    assert "tierax calibrate" not in guess.sources["matmul"]


@pytest.mark.parametrize(
    "seq, head_dim, fwd",
    [
        (2048, 128, 56e12),
        (8192, 128, 100e12),
        # between the measured 2048 and 8192: linear in log sequence
        (6000, 128, 56e12 + math.log(6000 / 2048) / math.log(4) * 44e12),
        (4096, 64, 36e12),  # head dim 64 measured at 2048 only: the nearest beyond
    ],
)
def test_splash_rates_follow_the_programs_shape(seq, head_dim, fwd):
    from types import SimpleNamespace

    r = cm.target_rates("v5e", "bfloat16", calibration={"v5e": ENTRY})
    prog = SimpleNamespace(seq=seq, attention=SimpleNamespace(qk_head_dim=head_dim))
    got = cm.for_program(r, prog)
    assert got.fused_attention_fwd_flops_per_s == pytest.approx(fwd, rel=1e-12)
    assert f"at sequence {seq}, head dim {head_dim}" in got.sources["fused_attention"]


# --- the chip check ------------------------------------------------------------------------------


def test_tpu_check_rehearsal_on_the_cpu(tmp_path):
    """bench/tpu_check.py --tiny --checked: the chip check's whole pipeline at toy sizes (one
    model, one microbatch): calibration, every preset and `plan --check`'s plan run, predicted and
    compiled for v5e (deviceless here), the reference step, the record and its page."""
    out = tmp_path / "tc.json"
    r = subprocess.run(
        [
            sys.executable,
            "bench/tpu_check.py",
            "--tiny",
            "--checked",
            "--cases",
            "dense:2",
            "--stages",
            "cases,reference",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "tierax.tpu-check/1" and doc["tiny"]
    (case,) = doc["cases"]
    names = [p["plan"] for p in case["plans"]]
    assert names[:4] == ["save-all", "remat-full", "minimal", "qkv-offload"]
    assert {"calibrated", "checked"} <= set(case["planner_chose"])
    # the check's compiles, each with the budget it planned within and what XLA's compile said
    assert case["check"] and case["check"][0]["iteration"] == 1
    assert {"budget_bytes", "xla_peak_bytes", "compiled_step_s", "plan"} <= set(case["check"][0])
    assert case["check"][0]["plan"] == case["planner_chose"]["calibrated"]
    for p in case["plans"]:
        assert p["ran"] and p["step_time_s"] > 0
        assert p["predicted_calibrated"]["step_time_s"] > 0
        # every plan compiled for v5e, priced at this run's measured rates: the compile's model
        # step is the calibrated prediction (a compile at the datasheet's rates differs)
        c = p["compiled"]
        assert c["compiled_on"] == "deviceless" and c["fits"]
        assert c["model_step_s"] == pytest.approx(p["predicted_calibrated"]["step_time_s"])
        assert c["model_step_s"] != pytest.approx(p["predicted_uncalibrated"]["step_time_s"])
        assert c["compiled_step_s"] >= c["model_step_s"]
        assert p["time_error_compiled"] == pytest.approx(
            c["compiled_step_s"] / p["step_time_s"] - 1
        )
    assert "worst_time_error_compiled" in case["summary"]
    assert doc["reference"]["tierax_step_s"] > 0 and doc["reference"]["reference_step_s"] > 0
    # The host link is calibrate's: beside compute (rows at each size), the round trip beside it;
    # the entry's rate is the one its rate_from names.
    link = doc["calibration"]["microbenchmarks"]["host_link"]
    beside = link["beside_compute"]
    assert [r["layer_bytes"] for r in beside["rows"]] == [2**18, 2**19]  # tiny: 0.25, 0.5 MiB
    assert {"offload_s", "keep_s", "added_s"} <= set(beside["rows"][0])
    used = beside if link["rate_from"] == "beside compute" else link["round_trip"]
    assert link["d2h_bytes_per_s"] == used["d2h_bytes_per_s"]
    assert doc["calibration"].get("d2h_bytes_per_s") == link["d2h_bytes_per_s"]
    # The gathers and scatters at --tiny's sizes (tpu_check.TINY_INDEXED; the chip's take seconds a
    # call on XLA:CPU), both rates in the entry the cost model reads.
    idx = doc["calibration"]["microbenchmarks"]["indexed"]
    assert idx["gather"]["indices"] == 4096 and [s["width"] for s in idx["scatters"]] == [128] * 2
    assert doc["calibration"]["index_op_s"] == idx["index_op_s"] > 0
    assert doc["calibration"]["scatter_bytes_per_s"] == idx["scatter_bytes_per_s"] > 0
    assert doc["reference"]["shape"]["vocab"] == 1024  # tiny: the toy step's head and loss
    sys.path.insert(0, str(ROOT / "bench"))
    import _tpu_check_report as tpu_check_report

    page, png = tpu_check_report.render(out, tmp_path / "p.md", tmp_path / "p.png")
    text = page.read_text()
    assert "| dense | 2 | remat-full |" in text and png.stat().st_size > 1000


@pytest.mark.parametrize(
    "args, says",
    [
        (["--cases", "dense:x"], "is not MODEL:MICROBATCH"),
        (["--cases", "dense:0"], "is not MODEL:MICROBATCH"),
        (["--cases", "dense:8", "--models", "dense"], "give --cases alone"),
        (["--cases", "dens:8"], "unknown model(s) dens"),
        (["--stages", "cases,boundry"], "unknown stage(s) boundry"),
        (["--as-recorded"], "--as-recorded takes the rates of --calibration RECORD"),
    ],
)
def test_the_chip_check_refuses_bad_selections_before_any_work(tmp_path, args, says):
    out = tmp_path / "tc.json"
    r = subprocess.run(
        [sys.executable, "bench/tpu_check.py", "--tiny", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 2 and says in r.stderr, r.stderr[-2000:]
    assert not out.exists()


def test_an_earlier_calibration_as_recorded_measures_nothing(monkeypatch):
    """--calibration RECORD --as-recorded: the record's entry, host link included, named as such;
    without --as-recorded the host link is measured again."""
    import importlib.util

    from tierax.measure import accel_rates

    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("tpu_check_script", ROOT / "bench/tpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    record = ROOT / "bench/results/chip/tpu_check_checked.json"
    recorded = json.loads(record.read_text())["calibration"]
    measured = []
    fake = {"d2h_bytes_per_s": 1.0, "h2d_bytes_per_s": 2.0}
    monkeypatch.setattr(accel_rates, "host_link_rates", lambda tiny: measured.append(tiny) or fake)
    entry = mod.reuse_calibration(record, tiny=False, link=False)
    assert measured == [] and entry["rates_from"].startswith("tpu_check_checked.json (as recorded")
    assert {k: v for k, v in entry.items() if k != "rates_from"} == {
        k: v for k, v in recorded.items() if k != "rates_from"
    }
    again = mod.reuse_calibration(record, tiny=False)
    assert measured == [False] and (again["d2h_bytes_per_s"], again["h2d_bytes_per_s"]) == (
        1.0,
        2.0,
    )


def test_a_state_preset_takes_the_planners_training_state():
    """A case's ``<preset>+state`` is the preset's placements with the calibrated planner's
    training state (plan --check's alternative); without offloaded state it is left out, said."""
    import dataclasses
    import importlib.util

    from tierax import plan as plan_lib

    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("tpu_check_script", ROOT / "bench/tpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = _tiny()
    planned = plan_lib.preset("qkv-offload", cfg)
    with_state = dataclasses.replace(planned, state={"decoder": {"moments": "offload"}})
    plans, notes = mod._preset_plans(["remat-full", "remat-full+state"], cfg, with_state)
    assert [p.name for p in plans] == ["remat-full", "remat-full+state"] and notes == []
    full = plan_lib.preset("remat-full", cfg)
    assert plans[1].groups == full.groups and plans[1].state == with_state.state
    assert plans[1].state != full.state
    plans, notes = mod._preset_plans(["remat-full+state"], cfg, planned)
    assert plans == [] and notes == [
        "remat-full+state: the planner's plan offloads no training state"
    ]
    plans, notes = mod._preset_plans(["remat-full+state"], cfg, None)
    assert plans == [] and len(notes) == 1


def test_the_chip_checks_extra_cases_are_the_shapes_they_are_named_for():
    """dense-8k and dense-hd64 (run when --models names them) build at chip size: the dense width
    at seq 8192 with 128-wide heads, and with 64-wide heads (32 of them); the default selection
    is unchanged."""
    import importlib.util

    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("tpu_check_script", ROOT / "bench/tpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert [c[0] for c in mod.CASES] == ["dense", "moe", "mla-moe"]
    extra = {c[0]: c for c in mod.EXTRA_CASES}
    built = {n: mod.config_for(n, c[1], c[2], tiny=False) for n, c in extra.items()}
    dense = mod.config_for("dense", *mod.CASES[0][1:3], tiny=False)
    assert (built["dense-8k"].head_dim, extra["dense-8k"][3]) == (128, 8192)
    assert (built["dense-hd64"].head_dim, built["dense-hd64"].num_heads) == (64, 32)
    for cfg in built.values():
        assert (cfg.d_model, cfg.num_layers, cfg.mlp_dim) == (
            dense.d_model,
            dense.num_layers,
            dense.mlp_dim,
        )
    assert set(extra) <= set(mod.TINY_OVERRIDES)


@chip_only
def test_calibrate_on_the_chip_stores_the_v5e_key(tmp_path):
    env = dict(os.environ, TIERAX_CALIBRATION=str(tmp_path / "cal.json"))
    env.pop("JAX_PLATFORMS", None)
    r = subprocess.run(
        [sys.executable, "-m", "tierax.cli", "calibrate", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["target"] == "v5e" and doc["matmul_flops_per_s_bfloat16"] > 50e12


def test_a_plans_fresh_state_does_not_compile_the_init_again():
    """bench builds each plan's state afresh in every round: the parameters' jitted init is made
    once per (config, seed, mesh), and a fresh state equals the first."""
    from tierax.train import step as step_lib

    cfg = _tiny()
    step_lib._jitted_init.cache_clear()
    _, a = step_lib.init_params(cfg, seed=3)
    _, b = step_lib.init_params(cfg, seed=3)
    _, c = step_lib.init_params(cfg, seed=4)
    info = step_lib._jitted_init.cache_info()
    assert (info.hits, info.misses) == (1, 2)
    same = jax.tree.map(lambda x, y: bool((x == y).all()), a, b)
    assert all(jax.tree.leaves(same))
    assert not all(jax.tree.leaves(jax.tree.map(lambda x, y: bool((x == y).all()), a, c)))


def test_plans_compiled_ahead_in_threads_are_the_programs_bench_compiles():
    """On an accelerator bench compiles every plan at once in threads from one state's shapes; the
    programs are the ones a plan's own state compiles (XLA's memory analysis equal) and a step of
    one gives the same loss."""
    from tierax import plan as plan_lib
    from tierax.measure import harness
    from tierax.mesh import MeshShape
    from tierax.sharding import rules as sh
    from tierax.train import step as step_lib

    cfg = _tiny()
    n = jax.device_count()
    mesh = MeshShape(fsdp=n).make()
    opt = step_lib.make_optimizer(mu_dtype=cfg.mu_dtype)
    tokens = jax.device_put(step_lib.synthetic_batch(cfg, n, 16), sh.batch_sharding(mesh))
    plans = [plan_lib.preset(p, cfg) for p in ("remat-full", "minimal")]
    ahead = bench.compile_ahead(cfg, plans, opt, mesh, tokens, on_cpu=True)
    assert set(ahead) == {"remat-full", "minimal"}
    for p in plans:
        losses, analyses = [], []
        for given in (ahead[p.name], None):
            graphdef, state = step_lib.init_state(cfg, opt, mesh=mesh, plan=p)
            fn = step_lib.make_train_step(graphdef, cfg, p, opt, step_lib.shardings_of(state))
            prep = harness.prepare(
                lambda fn=fn, state=state: (fn, state), tokens, warmup=1, compiled=given
            )
            losses.append(float(prep.metrics["loss"]))
            analyses.append(prep.compiled_memory)
            bench.free(prep.state)
        assert losses[0] == losses[1] and analyses[0] == analyses[1]
    assert bench.compile_ahead(cfg, plans, opt, mesh, tokens) == {}  # a CPU runs them in turn


def test_only_the_rehearsal_measures_gathers_and_scatters_at_toy_sizes(monkeypatch):
    """--tiny measures the gathers and scatters at tpu_check.TINY_INDEXED's sizes, the chip check
    at the chip's (tierax.measure.accel_rates' own), and the rehearsal leaves those as it found
    them."""
    import importlib.util

    from tierax.measure import accel_rates, calibrate

    spec = importlib.util.spec_from_file_location("tpu_check_script", ROOT / "bench/tpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    chip = {k: getattr(accel_rates, k) for k in mod.TINY_INDEXED}
    seen = []
    monkeypatch.setattr(
        calibrate,
        "with_indexed",
        lambda entry, calls: seen.append(({k: getattr(accel_rates, k) for k in chip}, calls)),
    )
    mod.measure_indexed({}, tiny=True)
    mod.measure_indexed({}, tiny=False)
    assert seen == [(mod.TINY_INDEXED, 3), (chip, 20)]
    assert {k: getattr(accel_rates, k) for k in chip} == chip != mod.TINY_INDEXED
    assert chip["INDEX_LOOKUPS"] == 65536 and mod.REFERENCE_SHAPE["vocab"] == 32000
