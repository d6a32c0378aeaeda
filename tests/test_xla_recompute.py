"""XLA's own recompute (:mod:`tierax.xla.recompute`): the clones its rematerialization pass adds,
found by name in hand-written scheduled HLO and priced by hand; ``tierax compile`` shows the
figure.  Units as in test_hlo: each 1024³ f32 dot takes 1 ms, a 4 MiB elementwise op 1 ms of HBM.
The slow test reads XLA:TPU's own deviceless compile of a plan at the scheduler's limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tierax.xla import hlo, recompute

MS = 1e-3
RATES = {"peak_flops": 2 * 1024**3 / MS, "hbm_bytes_per_s": 3 * 4 * 1024**2 / MS}
A = "f32[1024,1024]{1,0}"
DOT = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"


def module(trips: int = 4) -> hlo.Module:
    """A loop of ``trips`` trips whose body holds a dot and its clone ``.remat2``, an add and its
    clone ``.remat``; the entry holds one dot clone outside the loop and names that only look
    alike (``remat`` inside a name, ``.rematerialize``)."""
    text = (
        "HloModule m, is_scheduled=true\n\n"
        f"%cond (c: {A}) -> pred[] {{\n  %c = {A} parameter(0)\n  ROOT %t = pred[] "
        f"constant(true)\n}}\n\n%body (b: {A}) -> {A} {{\n  %b = {A} parameter(0)\n"
        f"  %fusion.3 = {A} dot(%b, %b), {DOT}\n"
        f"  %fusion.3.remat2 = {A} dot(%b, %b), {DOT}\n"
        f"  %add.1.remat = {A} add(%fusion.3, %b)\n"
        f"  ROOT %add.2 = {A} add(%fusion.3.remat2, %add.1.remat)\n}}\n\n"
        f"ENTRY %main (p0: {A}) -> {A} {{\n  %p0 = {A} parameter(0)\n"
        f"  %w = {A} while(%p0), condition=%cond, body=%body, "
        f'backend_config={{"known_trip_count":{{"n":"{trips}"}}}}\n'
        f"  %dot.9.remat = {A} dot(%w, %w), {DOT}\n"
        f"  %remat_fusion.1 = {A} dot(%dot.9.remat, %w), {DOT}\n"
        f"  ROOT %x.rematerialize = {A} add(%remat_fusion.1, %w)\n}}\n"
    )
    return hlo.parse_module(text)


def test_the_clones_are_found_by_their_suffix_and_priced_per_step():
    clones = {r.name: r for r in recompute.recomputed(module(4), **RATES)}
    assert set(clones) == {"fusion.3.remat2", "add.1.remat", "dot.9.remat"}
    dot = clones["fusion.3.remat2"]
    assert (dot.computation, dot.executions, dot.flops) == ("body", 4, 2 * 1024**3)
    assert dot.seconds == pytest.approx(4 * MS)  # 1 ms a trip, 4 trips
    # the add reads two 4 MiB operands and writes 4 MiB: 12 MiB at 12 MiB/ms, 1 ms a trip
    assert clones["add.1.remat"].seconds == pytest.approx(4 * MS)
    assert clones["dot.9.remat"].executions == 1
    assert clones["dot.9.remat"].seconds == pytest.approx(MS)
    summary = recompute.summary(list(clones.values()))
    assert summary["instructions"] == 3
    assert summary["est_s"] == pytest.approx(9 * MS)
    assert summary["flops"] == pytest.approx(5 * 2 * 1024**3)


def test_more_trips_recompute_more():
    two = recompute.summary(recompute.recomputed(module(2), **RATES))
    assert two["est_s"] == pytest.approx(5 * MS)  # 2 × (1 + 1) ms in the loop, 1 ms outside


def test_a_kernels_own_time_prices_its_clone():
    clones = recompute.recomputed(
        module(4), **RATES, kernel_s=lambda m, ins: 7 * MS if ins.opcode == "add" else None
    )
    by = {r.name: r.seconds for r in clones}
    assert by["add.1.remat"] == pytest.approx(28 * MS)
    assert [r.name for r in clones][0] == "add.1.remat"  # largest first


def test_the_compiled_step_adds_the_recompute_and_only_an_excess_of_loads():
    assert recompute.compiled_step_s(1.0, 0.2, 0.05) == pytest.approx(1.25)
    # the replay exposing fewer loads than the model takes nothing back
    assert recompute.compiled_step_s(1.0, 0.2, -0.05) == pytest.approx(1.2)


def test_compile_table_shows_xlas_own_recompute():
    from rich.console import Console

    from tierax.report.tables import compile_table
    from tierax.xla.result import CompileResult

    gib = 2**30
    compiled = CompileResult(
        "m", "p", "v5e", 1, {}, 1, 64, "none", True, gib, 16 * gib, gib, 0, 0, 0, 0, (), {}, 1.0,
        xla_recompute=recompute.summary(recompute.recomputed(module(4), **RATES)),
        predicted={"peak_device_bytes": gib, "peak_phase": "backward", "model_step_s": 0.5,
                   "compiled_step_s": 0.509},
    )  # fmt: skip
    console = Console(width=200, record=True)
    console.print(compile_table(compiled))
    text = console.export_text()
    assert "XLA's own recompute (rematerialization pass)" in text
    assert "3 instruction(s), est. 9.000 ms" in text
    assert "500.0 ms · 509.0 ms" in text


@pytest.mark.slow
def test_xla_tpu_recomputes_on_its_own_at_the_limit_and_the_check_prices_it():
    """``tierax plan --check`` at the chip check's dense shape, microbatch 32 (the moments on the
    host): XLA:TPU's deviceless compile of the planner's plan recomputes the MLP and the head on
    its own (as the chip's profile of that plan showed); its loads agree once the streamed
    update's own exposure is counted, so it converges at once, prices the recompute, compiles the
    presets' placements with the plan's state beside it and keeps the shortest compiled step — one
    of the presets' here, as on the chip
    (bench/results/chip/recompute_on_chip_mb32_alternatives.json)."""
    pytest.importorskip("libtpu")
    sets = ["d_model=2048", "num_layers=8", "mlp_dim=8192", "num_kv_heads=8",
            "vocab_size=32000", "dtype=bfloat16", "attention=auto", "num_heads=16",
            "head_dim=128"]  # fmt: skip
    argv = [sys.executable, "-m", "tierax.cli", "plan", "--model", "tiny-llama",
            *[a for kv in sets for a in ("--set", kv)], "--microbatch", "32", "--seq", "2048",
            "--target", "v5e", "--devices", "1", "--check", "--json"]  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1200, env=os.environ.copy())
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    it, *alternatives = doc["iterations"]
    assert doc["converged"] and [a["alternative"] for a in alternatives] == [
        "remat-full",
        "qkv-offload",
    ]
    assert it["xla_recompute_s"] > 0.05 * it["predicted_step_s"]
    assert it["compiled_step_s"] >= it["predicted_step_s"] + it["xla_recompute_s"]
    best = min(alternatives, key=lambda a: a["compiled_step_s"])
    assert best["compiled_step_s"] < it["compiled_step_s"]
    assert doc["plan"]["plan"]["plan"] == f"{best['alternative']}+state"
    # simulate's side of it: the chosen plan is flagged as one XLA:TPU rematerialises on its own
    assert doc["plan"]["predicted"]["xla_may_rematerialize"]


@pytest.mark.slow
@pytest.mark.parametrize("microbatch, flagged", [(16, False), (24, True)])
def test_xla_tpu_recomputes_on_its_own_where_simulate_flags_it(microbatch, flagged):
    """remat-full at the chip check's dense shape, no state on the host: at microbatch 16 the model
    peaks within XLA:TPU's scheduler limit and XLA:TPU's deviceless compile recomputes nothing on
    its own; at 24 (above it) the compile holds rematerialization clones."""
    pytest.importorskip("libtpu")
    cfg, prog, rates = _dense(microbatch)
    from tierax import costmodel as cm
    from tierax.plan.presets import load_plan

    pred = cm.simulate(load_plan("remat-full", cfg), prog, rates, "lhs")
    assert pred.xla_may_rematerialize is flagged
    sets = _dense_sets()
    argv = [sys.executable, "-m", "tierax.cli", "compile", "--model", "tiny-llama",
            *[a for kv in sets for a in ("--set", kv)], "--microbatch", str(microbatch),
            "--seq", "2048", "--target", "v5e", "--devices", "1", "--plan", "remat-full",
            "--json"]  # fmt: skip
    env = dict(os.environ, JAX_PLATFORMS="cpu")  # deviceless, even beside a chip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1200, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (json.loads(p.stdout)["xla_recompute"]["instructions"] > 0) is flagged


def _dense_sets() -> list[str]:
    """The chip check's dense shape's overrides (bench/tpu_check.py's dense-state case)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    import tpu_check

    return next(c for c in tpu_check.EXTRA_CASES if c[0] == "dense-state")[2]


def _dense(microbatch: int):
    """The chip check's dense shape (bench/tpu_check.py) at ``microbatch`` × seq 2048: its config
    and program, and v5e's default rates (no calibration)."""
    from tierax import costmodel as cm
    from tierax.models import apply_overrides, for_platform, get_config
    from tierax.tracing.model_program import program_of

    sets = _dense_sets()
    cfg = for_platform(apply_overrides(get_config("tiny-llama"), sets), "tpu")
    rates = cm.target_rates("v5e", cfg.dtype, calibration={})
    return cfg, program_of(cfg, microbatch, 2048, {"data": 1, "fsdp": 1}), rates


def test_training_state_on_the_host_counts_toward_xlas_own_rematerialization():
    """simulate flags a step XLA:TPU likely rematerialises on its own: the planner's microbatch-32
    plan of the chip check's dense shape peaks within the scheduler limit, but with its moments on
    the host above it (XLA's compile of it recomputes ~0.5 s on its own:
    bench/results/chip/tpu_check_state.json); remat-full at microbatch 16, within the limit with
    no state on the host, is not flagged (its compile recomputes nothing)."""
    from rich.console import Console

    from tierax import costmodel as cm
    from tierax.plan.presets import load_plan
    from tierax.report.tables import prediction_table

    root = os.path.join(os.path.dirname(__file__), "..")
    cfg, prog, rates = _dense(32)
    plan = load_plan(os.path.join(root, "bench/results/chip/plans/planned_state_mb32.yaml"), cfg)
    pred = cm.simulate(plan, prog, rates, "lhs")
    lim, state = rates.scheduler_limit_bytes, pred.breakdown.state.host_bytes
    assert pred.fits and pred.peak_device_bytes < lim < pred.peak_device_bytes + state
    assert pred.xla_may_rematerialize and pred.to_json()["xla_may_rematerialize"]
    console = Console(width=300, record=True)
    console.print(prediction_table(pred, "t"))
    text = console.export_text()
    assert "with the 3.8 GiB of training state on the host" in text
    assert "step time a lower bound" in text
    cfg, prog, rates = _dense(16)
    pred = cm.simulate(load_plan("remat-full", cfg), prog, rates, "lhs")
    assert pred.breakdown.state.host_bytes == 0 and pred.peak_device_bytes < lim
    assert not pred.xla_may_rematerialize
    console = Console(width=300, record=True)
    console.print(prediction_table(pred, "t"))
    assert "lower bound" not in console.export_text()
