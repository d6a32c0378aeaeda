"""Per-layer-segment plans: YAML form and validation, gradients, the planner's split search, the
compile.

* a segmented plan round-trips through YAML; overlapping, missing, out-of-range and malformed ranges
  are errors that name the layers;
* gradients of segmented plans (offloaded, recomputed and no-remat segments in one group) equal the
  no-remat step's, for both tiny models;
* the planner's split search equals a brute force over every split point and every placement of the
  names (each candidate scored by ``simulate`` of the Plan it spells, not by the MILP), and on the
  fixture the optimum really is segmented;
* compiled deviceless for H200, each segment's offloaded names are found in host memory at the
  inventory's per-segment size.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import jax
import pytest

from tierax import costmodel as cm
from tierax import names as N
from tierax import plan as P
from tierax.errors import TieraxError
from tierax.models import get_config
from tierax.solving import planner
from tierax.tracing.inventory import Activation, GroupInventory, Inventory
from tierax.tracing.model_program import for_inventory
from tierax.train import step as S

QKV = {N.QUERY_PROJ: "offload", N.KEY_PROJ: "offload", N.VALUE_PROJ: "offload"}


def _llama_plan(segments_yaml: str) -> str:
    return (
        "plan: seg\ngroups:\n  decoder:\n    default: remat\n    decoder_layer_input: device\n"
        "    segments:\n" + segments_yaml
    )


def test_yaml_round_trip_and_resolution():
    cfg = get_config("tiny-llama")
    plan = P.Plan.from_yaml(
        _llama_plan(
            "    - layers: 0-2\n      query_proj: offload\n"
            "    - layers: '3'\n      query_proj: device\n"
        )
    )
    assert P.Plan.from_yaml(plan.to_yaml()) == plan
    r = P.resolve(plan, cfg)
    assert list(r) == ["decoder@0-2", "decoder@3-3"]
    assert (
        r["decoder@0-2"][N.QUERY_PROJ] is P.Placement.OFFLOAD
        and r["decoder@3-3"][N.QUERY_PROJ] is P.Placement.DEVICE
    )
    assert (
        r["decoder@3-3"][N.MLPWO] is P.Placement.REMAT
    )  # the group's default where the segment is silent


@pytest.mark.parametrize(
    "segments, message",
    [
        ("    - layers: 0-2\n    - layers: 2-3\n", r"layer\(s\) 2 in more than one segment"),
        ("    - layers: 0-1\n", r"layer\(s\) 2, 3 in no segment"),
        ("    - layers: 0-4\n", "goes past the group's last layer \\(3\\)"),
        ("    - layers: 3-1\n", "ends before it starts"),
        ("    - layers: first\n", "not a range like '0-23'"),
        ("    - layers: 0-3\n      default: device\n", "set 'default' on the group"),
        (
            "    - layers: 0-3\n      query_projj: offload\n",
            r"no activation 'query_projj' \(did you mean 'query_proj'\?\)",
        ),
        ("    - query_proj: offload\n", "give 'layers: A-B'"),
    ],
)
def test_bad_segments_are_refused_with_the_layers_named(segments, message):
    with pytest.raises(TieraxError, match=message):
        P.resolve(P.Plan.from_yaml(_llama_plan(segments)), get_config("tiny-llama"))


def test_segments_need_the_prefetch_mechanism():
    plan = dataclasses.replace(
        P.Plan.from_yaml(_llama_plan("    - layers: 0-3\n      query_proj: offload\n")),
        mechanism="policy",
    )
    with pytest.raises(TieraxError, match="segmented scan"):
        P.to_policies(plan, get_config("tiny-llama"))


def _segmented(cfg, group_segments: dict[str, list[tuple[int, int, dict]]]) -> P.Plan:
    groups = {}
    for g in cfg.layer_groups():
        # (start, stop, placements[, unnamed]): "device" keeps every intermediate (no remat)
        segs = tuple(P.Segment(*s) for s in group_segments.get(g.name, []))
        groups[g.name] = P.GroupPlan({N.DECODER_LAYER_INPUT: "device"}, P.Placement.REMAT, segs)
    return P.Plan("segmented", groups)


def _all_device(cfg, group: str) -> dict:
    return {n: "device" for n in next(g for g in cfg.layer_groups() if g.name == group).activations}


@pytest.mark.parametrize(
    "model", ["tiny-llama", pytest.param("tiny-deepseek", marks=pytest.mark.slow)]  # MoE: 13 s
)
def test_segmented_gradients_equal_the_no_remat_step(model):
    """Segments with q/k/v offloaded (prefetched), everything recomputed, and no remat at all."""
    cfg = get_config(model)
    if model == "tiny-llama":  # one group of 4 layers, split three ways
        cuts = {
            "decoder": [(0, 2, QKV), (2, 3, {}), (3, 4, _all_device(cfg, "decoder"), "device")]
        }
    else:  # dense (2 layers): one segment; moe (2 layers): recomputed, then no remat
        cuts = {
            "dense": [(0, 2, QKV)],
            "moe": [(0, 1, {}), (1, 2, _all_device(cfg, "moe"), "device")],
        }
    plan = _segmented(cfg, cuts)
    parts = [q for pol in P.to_policies(plan, cfg).values() for q in pol.parts]
    assert {(bool(q.offload), q.save_all) for q in parts} == {
        (True, False),
        (False, False),
        (False, True),
    }
    graphdef, params = S.init_params(cfg, seed=1)
    tokens = S.synthetic_batch(cfg, 4, 32, seed=2)
    ref_loss, ref_grads = S.loss_and_grads(graphdef, cfg, P.preset("save-all", cfg), params, tokens)
    loss, grads = S.loss_and_grads(graphdef, cfg, plan, params, tokens)
    assert abs(float(loss) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss))
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=False):
        scale = max(float(abs(b).max()), 1e-30)
        assert float(abs(a - b).max()) / scale <= 1e-5


# --- the split search against brute force ---------------------------------------------------------

NAMES3 = (N.QUERY_PROJ, N.MLPWI_0, N.MLPWO)
CODE = (P.Placement.DEVICE, P.Placement.OFFLOAD, P.Placement.REMAT)


def _inventory() -> Inventory:
    """tiny-llama's one group, 4 layers, three names: q (costly to recompute), mlpwi_0 (large),
    mlpwo (cheap)."""
    MB = 2**20
    acts = (
        Activation("decoder", N.DECODER_LAYER_INPUT, 4 * MB, 4, 0.0),
        Activation("decoder", N.QUERY_PROJ, 24 * MB, 4, 6e9),
        Activation("decoder", N.MLPWI_0, 64 * MB, 4, 2e9),
        Activation("decoder", N.MLPWO, 8 * MB, 4, 0.1e9),
    )
    g = GroupInventory(
        "decoder",
        4,
        acts,
        carry_bytes_per_layer=4 * MB,
        save_all_bytes_per_layer=110 * MB,
        base_recompute_flops_per_layer=0.5e9,
        forward_flops_per_layer=8e9,
        layer_param_count=1000,
    )
    return Inventory(
        "synthetic",
        4,
        64,
        {"data": 1, "fsdp": 1},
        (g,),
        param_bytes=100 * MB,
        grad_bytes=100 * MB,
        optimizer_bytes=200 * MB,
        logits_bytes=1 * MB,
        embed_param_count=1000,
    )


def _rates() -> cm.Rates:
    return cm.Rates("synthetic", 1e12, 4e12, 8e9, 8e9, 450e9, 10**15, 10**15, True)


def _brute_force(cfg, inv, rates, budget):
    """(seconds, plan) of the fastest plan over no split and every split point × every placement of
    NAMES3 × (where all three are on device) the unnamed intermediates kept or recomputed."""
    best = (float("inf"), None)
    for k in (None, 2):  # the planner offers segments of ≥ 2 layers
        ranges = [(0, 4)] if k is None else [(0, k), (k, 4)]
        for codes, keeps in itertools.product(
            itertools.product(range(3), repeat=3 * len(ranges)),
            itertools.product((False, True), repeat=len(ranges)),
        ):
            segs = []
            for j, (a, b) in enumerate(ranges):
                mine = codes[3 * j : 3 * j + 3]
                if keeps[j] and any(mine):
                    break  # keeping the unnamed values needs every name kept
                places = {n: CODE[c] for n, c in zip(NAMES3, mine, strict=False)}
                segs.append(
                    (a, b, _all_device(cfg, "decoder"), "device") if keeps[j] else (a, b, places)
                )
            if len(segs) < len(ranges):
                continue
            if k is None and keeps[0]:
                plan = P.preset("save-all", cfg)
            elif k is None:
                plan = P.Plan(
                    "u", {"decoder": P.GroupPlan({N.DECODER_LAYER_INPUT: "device", **segs[0][2]})}
                )
            else:
                plan = _segmented(cfg, {"decoder": segs})
            pred = cm.simulate(plan, for_inventory(cfg, inv), rates, "lhs")
            if pred.peak_device_bytes <= budget and pred.step_time_s < best[0]:
                best = (pred.step_time_s, plan)
    return best


def test_split_search_equals_brute_force_and_the_optimum_is_segmented():
    cfg = get_config("tiny-llama")
    inv, rates = _inventory(), _rates()
    MB = 2**20
    found_segmented = False
    for budget_mb in (600, 720, 920):
        budget = budget_mb * MB
        seconds, best = _brute_force(cfg, inv, rates, budget)
        r = planner.plan(
            for_inventory(cfg, inv),
            rates,
            schedule="lhs",
            budget_bytes=budget,
            host_budget_bytes=10**12,
            segments=True,
        )
        assert r.predicted.peak_device_bytes <= budget
        assert r.predicted.step_time_s == pytest.approx(seconds, rel=1e-9), (r.plan, best)
        unsplit = planner.plan(
            for_inventory(cfg, inv),
            rates,
            schedule="lhs",
            budget_bytes=budget,
            host_budget_bytes=10**12,
        )
        if r.plan.groups["decoder"].segments:
            found_segmented = True
            assert r.predicted.step_time_s < unsplit.predicted.step_time_s
    assert found_segmented


def test_compiled_segments_put_each_offloaded_name_on_host_at_its_segment_size():
    from tierax.xla import compile as C

    cfg = get_config("tiny-llama")
    plan = _segmented(cfg, {"decoder": [(0, 2, QKV), (2, 4, {N.MLPWI_0: "offload"})]})
    r, _ = C.compile_for_target(cfg, plan, "h200", microbatch=2, seq=64)
    got = {(o.group, o.name): (o.expected_bytes, o.host_bytes) for o in r.offloaded}
    # Per layer at 2 × 64 tokens, float32: q 2·64·4·16·4 = 32 KiB, k and v 16 KiB each, mlpwi_0
    # 2·64·128·4 = 64 KiB.
    assert got == {
        ("decoder@0-1", N.QUERY_PROJ): (2 * 32768,) * 2,
        ("decoder@0-1", N.KEY_PROJ): (2 * 16384,) * 2,
        ("decoder@0-1", N.VALUE_PROJ): (2 * 16384,) * 2,
        ("decoder@2-3", N.MLPWI_0): (2 * 65536,) * 2,
    }
    assert r.host_temp_bytes == 2 * 65536 + 2 * 65536


def test_one_layer_segment_cannot_offload():
    """XLA drops a host round trip that no loop separates (a one-layer scan): refused, not silently
    a no-op."""
    cfg = get_config("tiny-llama")
    plan = _segmented(cfg, {"decoder": [(0, 3, {}), (3, 4, {N.MLPWI_0: "offload"})]})
    with pytest.raises(TieraxError, match="one-layer segment cannot offload \\(mlpwi_0\\)"):
        P.to_policies(plan, cfg)


ONE_LAYER_OFFLOAD = "    - layers: 0-2\n    - layers: '3'\n      mlpwi_0: offload\n"


@pytest.mark.parametrize(
    "plan_text, message",
    [
        (
            _llama_plan(ONE_LAYER_OFFLOAD),
            r"decoder@3-3: a one-layer segment cannot offload \(mlpwi_0",
        ),
        (
            "mechanism: policy\n" + _llama_plan("    - layers: 0-1\n    - layers: 2-3\n"),
            "has segments, which run in tierax's segmented scan",
        ),
    ],
)
def test_every_verb_refuses_what_the_segmented_scan_cannot_run_before_compiling(
    tmp_path, monkeypatch, capsys, plan_text, message
):
    """One validation (plan.resolve) for every verb: simulate and plans refuse what compile, verify
    and train would; verify and train refuse it before compiling (compiling here fails the test)."""
    import yaml

    from tierax import cli
    from tierax.measure import verify as V
    from tierax.train import loop as L

    f = tmp_path / "plan.yaml"
    f.write_text(plan_text)

    def no_compile(*a, **k):
        raise AssertionError("compiled before the plan was checked")

    monkeypatch.setattr(V, "compiled_step", no_compile)
    monkeypatch.setattr(L, "Trainer", no_compile)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    run = tmp_path / "run"
    train = tmp_path / "train.yaml"
    train.write_text(
        yaml.safe_dump(
            {
                "model": "tiny-llama",
                "plan": str(f),
                "microbatch": 2,
                "seq": 16,
                "steps": 2,
                "log": {"dir": str(run)},
            }
        )
    )
    for argv in (
        ["simulate", "--plan", str(f)],
        ["plans", "--show", str(f)],
        ["verify", "--plan", str(f), "--seq", "16"],
        ["train", str(train)],
    ):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert re.search(message, err), (argv, err)
    assert not run.exists()  # train wrote nothing (no empty checkpoint directory)


def test_segment_ranges_reach_the_scans_exactly():
    """The layer ranges a plan names are the ranges every consumer gets, one by one: to_policies'
    parts, resolve's and the inventory's segment rows (and the planner's splits likewise)."""
    from tierax.models import apply_overrides
    from tierax.tracing import inventory as inv_lib

    cfg = apply_overrides(get_config("tiny-llama"), ["num_layers=9"])
    plan = P.Plan.from_yaml(
        _llama_plan(
            "    - layers: 0-2\n      query_proj: offload\n"
            "    - layers: '3-4'\n      mlpwi_0: device\n"
            "    - layers: 5-8\n      key_proj: offload\n"
        )
    )
    parts = P.to_policies(plan, cfg)["decoder"].parts
    assert [(p.start, p.stop) for p in parts] == [(0, 3), (3, 5), (5, 9)]
    assert [(sorted(p.offload), sorted(p.keep)) for p in parts] == [
        ([N.QUERY_PROJ], []),
        ([], [N.MLPWI_0]),
        ([N.KEY_PROJ], []),
    ]
    assert list(P.resolve(plan, cfg)) == ["decoder@0-2", "decoder@3-4", "decoder@5-8"]
    inv = inv_lib.for_plan(inv_lib.model_inventory(cfg, 1, 8), plan, cfg)
    assert [(g.name, g.num_layers) for g in inv.groups] == [
        ("decoder@0-2", 3),
        ("decoder@3-4", 2),
        ("decoder@5-8", 4),
    ]
    split = planner.placements_to_plan({}, cfg, "split", "", splits={"decoder": 4})
    again = P.Plan.from_yaml(split.to_yaml())  # the YAML a planned split is written as reads back
    for plan in (split, again):
        assert [(p.start, p.stop) for p in P.to_policies(plan, cfg)["decoder"].parts] == [
            (0, 4),
            (4, 9),
        ]
