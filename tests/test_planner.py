"""The planner against exhaustive enumeration under the same cost model, and its invariants."""

import dataclasses
import itertools
import json
import subprocess
import sys

import pytest

from tierax import costmodel as cm
from tierax import plan as P
from tierax.errors import TieraxError
from tierax.models import get_config
from tierax.solving import planner
from tierax.tracing.inventory import model_inventory
from tierax.tracing.model_program import for_inventory

GIB = 2**30


@pytest.fixture(scope="module")
def llama():
    cfg = dataclasses.replace(get_config("tiny-llama"), num_layers=12)
    inv = model_inventory(cfg, 16, 256)
    # A small "GPU" so that budgets bind: same rates as h200, device memory from the test.
    rates = cm.target_rates("h200", cfg.dtype)
    return cfg, inv, rates


def exhaustive(cfg, inv, rates, schedule, budget, host_budget):
    items = cm.item_terms(inv, rates)
    choices = (
        list(P.Placement) if rates.offload_is_real else [P.Placement.DEVICE, P.Placement.REMAT]
    )
    best = None
    prog = for_inventory(cfg, inv)
    for combo in itertools.product(choices, repeat=len(items)):
        placements = {(i.group, i.name): c for i, c in zip(items, combo, strict=False)}
        pred = cm.evaluate(placements, prog, rates, schedule)
        if pred.peak_device_bytes <= budget and pred.host_bytes <= host_budget:
            if best is None or pred.step_time_s < best.step_time_s:
                best = pred
    return best


def bounds(cfg, inv, rates):
    everything = {(i.group, i.name): P.Placement.REMAT for i in cm.item_terms(inv, rates)}
    low = cm.evaluate(everything, for_inventory(cfg, inv), rates, "lhs").peak_device_bytes
    high = cm.simulate(
        P.preset("save-all", cfg), for_inventory(cfg, inv), rates, "lhs"
    ).peak_device_bytes
    return low, high


@pytest.mark.parametrize("schedule", ["serial", "lhs", "lhs-pipelined"])
@pytest.mark.parametrize("fraction", [0.15, 0.5, 0.9])
def test_planner_equals_exhaustive_optimum(llama, schedule, fraction):
    cfg, inv, rates = llama
    low, high = bounds(cfg, inv, rates)
    budget = low + fraction * (high - low)
    host = 0.3 * sum(i.bytes for i in cm.item_terms(inv, rates))  # the host budget binds too
    result = planner.plan(
        for_inventory(cfg, inv),
        rates,
        schedule=schedule,
        budget_bytes=budget,
        host_budget_bytes=host,
    )
    best = exhaustive(cfg, inv, rates, schedule, budget, host)
    assert result.predicted.step_time_s == pytest.approx(best.step_time_s, rel=1e-6)
    assert result.predicted.peak_device_bytes <= budget and result.predicted.host_bytes <= host


def test_planner_on_cpu_never_offloads(llama):
    cfg, inv, _ = llama
    rates = dataclasses.replace(cm.target_rates("h200", cfg.dtype), offload_is_real=False)
    low, high = bounds(cfg, inv, rates)
    budget = (low + high) / 2
    result = planner.plan(for_inventory(cfg, inv), rates, budget_bytes=budget)
    assert all(e.choice != "offload" for e in result.explain)
    best = exhaustive(cfg, inv, rates, "lhs", budget, rates.host_memory_bytes)
    assert result.predicted.step_time_s == pytest.approx(best.step_time_s, rel=1e-6)


def test_larger_budget_is_never_slower_and_always_within_budget(llama):
    cfg, inv, rates = llama
    low, high = bounds(cfg, inv, rates)
    previous = float("inf")
    for k in range(11):
        budget = low + (high - low) * k / 10
        r = planner.plan(for_inventory(cfg, inv), rates, budget_bytes=budget, host_budget_bytes=GIB)
        assert r.predicted.peak_device_bytes <= budget and r.predicted.host_bytes <= GIB
        assert r.predicted.step_time_s <= previous * (1 + 1e-9)
        previous = r.predicted.step_time_s
    # With room for everything, nothing is recomputed.
    assert r.predicted.breakdown.recompute_s == 0


def test_no_plan_fits_is_a_clear_error(llama):
    cfg, inv, rates = llama
    low, _ = bounds(cfg, inv, rates)
    with pytest.raises(TieraxError, match="recomputing everything still needs"):
        planner.plan(for_inventory(cfg, inv), rates, budget_bytes=low * 0.9)


def test_plan_is_a_loadable_plan_with_explanations(llama, tmp_path):
    cfg, inv, rates = llama
    low, high = bounds(cfg, inv, rates)
    r = planner.plan(for_inventory(cfg, inv), rates, budget_bytes=(low + high) / 2)
    f = tmp_path / "p.yaml"
    f.write_text(r.plan.to_yaml())
    again = P.load_plan(str(f), cfg)
    assert cm.simulate(again, for_inventory(cfg, inv), rates, "lhs").step_time_s == pytest.approx(
        r.predicted.step_time_s
    )
    # One row per activation, and one per priced part of each group's training state.
    assert {(e.group, e.name) for e in r.explain} == {
        (i.group, i.name) for i in cm.item_terms(inv, rates)
    } | {(g.name, f"state:{k}") for g in cfg.layer_groups() for k in ("moments", "master_weights")}
    assert all(e.why for e in r.explain)


def test_max_microbatch_finds_the_boundary():
    cfg = get_config("tiny-llama")
    rates = cm.target_rates("h200", cfg.dtype)
    budget = 64 * 2**20
    r = planner.max_microbatch(cfg, 128, {"data": 1, "fsdp": 1}, rates, budget_bytes=budget)
    assert r.predicted.peak_device_bytes <= budget
    bigger = model_inventory(cfg, r.microbatch + 1, 128)
    with pytest.raises(TieraxError):
        planner.plan(for_inventory(cfg, bigger), rates, budget_bytes=budget)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "tierax.cli", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )


@pytest.mark.slow  # three CLI verbs with traces
def test_cli_plan_simulate_inventory_json(tmp_path):
    out = tmp_path / "plan.yaml"
    r = _cli(
        "plan",
        "--model",
        "tiny-deepseek",
        "--target",
        "h200",
        "--microbatch",
        "8",
        "--seq",
        "64",
        "--budget-gib",
        "0.03",
        "--json",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {"plan", "predicted", "explain"} <= set(doc)
    assert {
        "fits",
        "peak_device_bytes",
        "device_capacity_bytes",
        "host_bytes",
        "step_time_s",
        "tflops_per_device",
        "breakdown",
    } <= set(doc["predicted"])
    assert doc["predicted"]["peak_device_bytes"] <= 0.03 * GIB
    s = _cli(
        "simulate",
        "--model",
        "tiny-deepseek",
        "--target",
        "h200",
        "--microbatch",
        "8",
        "--seq",
        "64",
        "--plan",
        str(out),
        "--json",
    )
    assert s.returncode == 0, s.stderr
    assert json.loads(s.stdout)["step_time_s"] == pytest.approx(doc["predicted"]["step_time_s"])
    i = _cli("inventory", "--model", "tiny-deepseek", "--microbatch", "8", "--seq", "64", "--json")
    assert i.returncode == 0 and {g["name"] for g in json.loads(i.stdout)["groups"]} == {
        "dense",
        "moe",
    }


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["simulate", "--schedule", "fast"], "unknown schedule"),
        (["simulate", "--target", "tpu"], "unknown target"),
        (["plan", "--devices", "8", "--mesh", "fsdp=4"], "has 4 devices but --devices is 8"),
        (["plan", "--budget-gib", "0.000001"], "no plan fits"),
        (["simulate", "--plan", "nope"], "neither a preset"),
    ],
)
def test_cli_bad_input_exits_2(args, fragment, cli):
    # The first case in a child process (the command's own exit status), the others in this one.
    run = _cli if args == ["simulate", "--schedule", "fast"] else cli
    r = run(*args, "--model", "tiny-llama")
    assert r.returncode == 2, r.stderr
    assert fragment in r.stderr and "Traceback" not in r.stderr
