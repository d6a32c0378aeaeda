"""A layer group of one layer offloads nothing.

With one layer there is no layer loop: XLA removes the single-trip loop, and a value the plan
offloads is stored to host and loaded straight back, both copies on device around the host one, so
the value occupies device memory throughout, under either mechanism (deviceless XLA:TPU compiles of
tiny-deepseek with a one-layer dense or MoE group under deepseek-offload, and of a one-layer
tiny-llama under qkv-offload: the group's names are not on host in the compile report).  So:

* the planner never offloads in a one-layer group (where it does in the same group of two layers);
* a plan that offloads there is refused by every verb, before any work (exit 2, nothing written);
* a preset recomputes there what it offloads elsewhere, says so on stderr and in its description;
* with libtpu: under such a preset the step's host buffers are exactly what simulate prices.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest
from test_planner_bruteforce import CFG, brute_force, fixture_groups, make_inventory, make_rates

from tierax import plan as P
from tierax.errors import TieraxError
from tierax.models import apply_overrides, config_to_dict, get_config
from tierax.solving import planner
from tierax.tracing.model_program import for_inventory

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
ONE_DENSE = ["num_layers=5", "first_dense_layers=1"]


@pytest.mark.parametrize("mechanism", ["prefetch", "policy"])
def test_the_planner_never_offloads_in_a_one_layer_group(mechanism):
    """The hand fixture's dense group at one layer and at two, at a tight device budget (a tenth of
    the way from recomputing everything to keeping everything, where offloading in the group pays
    either way): with two layers the planner offloads some of the group's names, with one none of
    them (and the plan it returns resolves)."""
    rates = make_rates(link_d2h=8e9, link_h2d=8e9)
    offloaded = {}
    for layers in (1, 2):
        groups = fixture_groups()
        groups[0] = dict(groups[0], layers=layers)
        inv = make_inventory(groups)
        peak, host, _ = brute_force(inv, rates, "lhs", mechanism)
        r = planner.plan(
            for_inventory(CFG, inv),
            rates,
            budget_bytes=int(peak.min() + 0.1 * (peak.max() - peak.min())),
            host_budget_bytes=int(host.max()),
            mechanism=mechanism,
            place_state=False,
        )
        resolved = P.resolve(r.plan, CFG)
        offloaded[layers] = [n for n, p in resolved["dense"].items() if p is P.Placement.OFFLOAD]
        assert [e.name for e in r.explain if e.group == "dense" and e.choice == "offload"] == (
            offloaded[layers]
        )
    assert offloaded[2], "the two-layer group offloads at this budget"
    assert offloaded[1] == []
    one = [e for e in r.explain if e.group == "moe"]
    assert one  # the other group is planned as before


def test_a_front_end_that_applies_the_plan_itself_keeps_offload_in_a_one_layer_group():
    """MaxText's program applies a plan by its own remat policy (Program.one_layer_groups_offload):
    the rule is tierax's own step's, so there the planner still offloads in the one-layer group at
    the tight budget, resolve accepts it and a preset keeps its placements."""
    import dataclasses

    rates = make_rates(link_d2h=8e9, link_h2d=8e9)
    groups = fixture_groups()
    groups[0] = dict(groups[0], layers=1)
    inv = make_inventory(groups)
    prog = dataclasses.replace(for_inventory(CFG, inv), one_layer_groups_offload=True)
    assert not for_inventory(CFG, inv).one_layer_groups_offload  # tierax's own step
    peak, host, _ = brute_force(inv, rates, "lhs", "prefetch")
    r = planner.plan(
        prog,
        rates,
        budget_bytes=int(peak.min() + 0.1 * (peak.max() - peak.min())),
        host_budget_bytes=int(host.max()),
        place_state=False,
    )
    resolved = P.resolve(r.plan, prog)
    assert [n for n, p in resolved["dense"].items() if p is P.Placement.OFFLOAD]
    # the program's own layer groups at one dense layer (for_inventory takes CFG's)
    one = tuple(
        dataclasses.replace(g, num_layers=1) if g.name == "dense" else g for g in prog.groups
    )
    for offloads, front_end in ((True, prog), (False, for_inventory(CFG, inv))):
        p1 = dataclasses.replace(front_end, groups=one)
        kept = P.resolve(P.preset("deepseek-offload", p1), p1)
        assert any(p is P.Placement.OFFLOAD for p in kept["dense"].values()) is offloads


def test_resolve_refuses_an_offload_in_a_one_layer_group():
    cfg = apply_overrides(get_config("tiny-deepseek"), ONE_DENSE)
    plan = P.Plan(
        "mine",
        {"dense": P.GroupPlan({"query_proj": "offload", "mlpwi_0": "offload"})},
        mechanism="policy",
    )
    with pytest.raises(
        TieraxError,
        match=r"plan 'mine', group 'dense': a one-layer group cannot offload "
        r"\(mlpwi_0, query_proj\).*Place them on device or remat",
    ):
        P.resolve(plan, cfg)
    # the same placements in the four-layer MoE group resolve
    P.resolve(P.Plan("mine", {"moe": P.GroupPlan({"query_proj": "offload"})}), cfg)


def test_a_preset_recomputes_what_it_would_offload_in_a_one_layer_group(capsys):
    cfg = apply_overrides(get_config("tiny-deepseek"), ONE_DENSE)
    plan = P.load_plan("deepseek-offload", cfg)
    resolved = P.resolve(plan, cfg)
    for n in ("query_proj", "key_proj", "value_proj", "mlpwi_0", "mlpwi_1"):
        assert resolved["dense"][n] is P.Placement.REMAT
    assert resolved["moe"]["moe_mlpwi_0"] is P.Placement.OFFLOAD
    assert "in one-layer group dense: recomputed, not offloaded" in plan.description
    err = capsys.readouterr().err
    assert "note: preset 'deepseek-offload': layer group 'dense' has one layer" in err
    assert "key_proj, mlpwi_0, mlpwi_1, query_proj, value_proj recomputed there instead" in err
    # a one-layer MoE group after four dense layers: its routed experts' up-projections too
    four = apply_overrides(get_config("tiny-deepseek"), ["num_layers=5", "first_dense_layers=4"])
    resolved = P.resolve(P.load_plan("deepseek-offload", four), four)
    for n in ("query_proj", "key_proj", "value_proj", "moe_mlpwi_0", "moe_mlpwi_1"):
        assert resolved["moe"][n] is P.Placement.REMAT
    assert resolved["dense"]["mlpwi_0"] is P.Placement.OFFLOAD
    assert "layer group 'moe' has one layer" in capsys.readouterr().err
    # groups of two layers or more: the preset as it always was, no note
    P.load_plan("deepseek-offload", get_config("tiny-deepseek"))
    assert capsys.readouterr().err == ""
    assert "one-layer" not in P.preset("deepseek-offload", get_config("tiny-deepseek")).description


def _old_preset_yaml(cfg) -> str:
    """deepseek-offload as a plan file that offloads in every group, one-layer ones too."""
    doc = P.preset("deepseek-offload", cfg).to_dict()
    for group in doc["groups"].values():
        for n in ("query_proj", "key_proj", "value_proj", "mlpwi_0", "mlpwi_1", "moe_mlpwi_0"):
            if n in group:
                group[n] = "offload"
    import yaml

    return yaml.safe_dump(doc, sort_keys=False)


def test_every_verb_refuses_a_plan_file_that_offloads_in_a_one_layer_group(
    tmp_path, monkeypatch, capsys
):
    """simulate, plans and train refuse it in-process before any work (train writes no run
    directory); compile for a TPU target refuses it before compiling (exit 2, nothing on stdout)."""
    import yaml

    from tierax import cli
    from tierax.train import loop as L

    cfg = apply_overrides(get_config("tiny-deepseek"), ONE_DENSE)
    f = tmp_path / "plan.yaml"
    f.write_text(_old_preset_yaml(cfg))
    message = (
        r"plan 'deepseek-offload', group 'dense': a one-layer group cannot offload "
        r"\(key_proj, mlpwi_0, mlpwi_1, query_proj, value_proj\)"
    )

    def no_trainer(*a, **k):
        raise AssertionError("trained before the plan was checked")

    monkeypatch.setattr(L, "Trainer", no_trainer)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    run = tmp_path / "run"
    train = tmp_path / "train.yaml"
    train.write_text(
        yaml.safe_dump(
            {
                "model": config_to_dict(cfg),
                "plan": str(f),
                "microbatch": 2,
                "seq": 16,
                "steps": 2,
                "log": {"dir": str(run)},
            }
        )
    )
    model = ["--model", "tiny-deepseek", "--set", ONE_DENSE[0], "--set", ONE_DENSE[1]]
    for argv in (
        ["simulate", *model, "--plan", str(f)],
        ["plans", *model, "--show", str(f)],
        ["train", str(train)],
    ):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert re.search(message, err), (argv, err)
    assert not run.exists()
    if HAS_LIBTPU:
        p = subprocess.run(
            [sys.executable, "-m", "tierax.cli", "compile", *model, "--plan", str(f),
             "--target", "v5e", "--devices", "1", "--microbatch", "2", "--seq", "512", "--json"],
            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert p.returncode == 2, p.stderr[-3000:]
        assert re.search(message, p.stderr) and p.stdout == ""


def test_a_one_layer_model_under_the_default_plan_simulates_without_offload(capsys):
    """tiny-llama of one layer under qkv-offload (compile's default plan): the preset recomputes
    q, k and v, so simulate prices no host bytes."""
    from tierax import cli

    argv = ["simulate", "--model", "tiny-llama", "--set", "num_layers=1", "--plan", "qkv-offload"]
    assert cli.main([*argv, "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["host_bytes"] == 0
    assert "layer group 'decoder' has one layer" in out.err


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: XLA:TPU cannot compile here")
@pytest.mark.parametrize(
    "first_dense",
    # The one-layer MoE group (4) under -m slow: the one-layer dense group's compile (1) checks
    # what XLA holds under the preset's rule, which is the same for every group, and
    # test_a_preset_recomputes_what_it_would_offload_in_a_one_layer_group its one-layer MoE group.
    [1, pytest.param(4, marks=pytest.mark.slow)],
)
def test_deviceless_v5e_compile_of_a_preset_with_a_one_layer_group(first_dense, cli):
    """tiny-deepseek with a one-layer dense (then MoE) group under deepseek-offload: every name
    offloaded is in a host buffer of its own, and XLA's host temp is exactly what simulate
    prices (no host bytes outside a named buffer, none priced that XLA does not hold).  compile
    in a new process (JAX started for a deviceless TPU), simulate (a trace) in this one."""
    args = ["--model", "tiny-deepseek", "--set", "d_model=256", "--set", "num_layers=5", "--set",
            f"first_dense_layers={first_dense}", "--plan", "deepseek-offload", "--target", "v5e",
            "--devices", "1", "--microbatch", "2", "--seq", "128", "--json"]  # fmt: skip
    out = {}
    for verb in ("compile", "simulate"):
        if verb == "compile":
            p = subprocess.run(
                [sys.executable, "-m", "tierax.cli", verb, *args],
                capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        else:
            p = cli(verb, *args)
        assert p.returncode == 0, p.stderr[-3000:]
        out[verb], out[verb + " stderr"] = json.loads(p.stdout), p.stderr
    compiled, offloaded = out["compile"], out["compile"]["offloaded"]
    one = "dense" if first_dense == 1 else "moe"
    assert offloaded and all(o["group"] != one for o in offloaded)
    assert all(o["on_host"] and o["host_bytes"] >= o["expected_bytes"] > 0 for o in offloaded)
    # every host byte in a named buffer; simulate prices exactly the names' buffers
    assert compiled["host_temp_bytes"] == sum(o["host_bytes"] for o in offloaded)
    assert out["simulate"]["host_bytes"] == sum(o["expected_bytes"] for o in offloaded)
    assert not [n for n in compiled["notes"] if "unattributed" in n], compiled["notes"]
    if one == "moe":  # the dense stacks are exact (XLA:TPU pads the routed experts' capacity)
        assert compiled["host_temp_bytes"] == out["simulate"]["host_bytes"]
    for verb in ("compile", "simulate"):
        assert f"layer group {one!r} has one layer" in out[verb + " stderr"]
