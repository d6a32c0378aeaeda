"""The MILP planner against an independent brute force over every plan (3^8 placements × the two
groups' unnamed intermediates kept or recomputed where all of its names are on device: 6724 per
inventory).

The reference here does not call tierax's cost functions (``item_terms``, ``group_terms``,
``fixed_terms``, ``evaluate``, ``simulate``): it re-derives each plan's step time and peak
device memory from first principles — bytes, FLOPs, the host-link rates each way, the
matmul rate and each schedule's documented hiding rule — following the model as
``tierax.costmodel``'s docstring defines it:

* time = (forward + 2× backward matmul FLOPs, LM head included) / matmul rate
  + non-matmul HBM bytes / HBM rate (every layer's forward and backward, the loss, AdamW's
  7 × parameter bytes)
  + recomputation FLOPs / matmul rate + recomputation HBM bytes / HBM rate (a group that keeps its
  unnamed intermediates — allowed only with every name on device — recomputes nothing; otherwise
  it pays its unnamed base recompute plus each rematerialised name, also with every name on device)
  + per group and direction, transfer seconds (offloaded bytes / link rate) not hidden:
  ``serial`` hides nothing, ``lhs`` up to half the layer's compute, ``lhs-pipelined`` up to
  the whole neighbouring layer's compute (forward compute, matmuls and HBM bytes, for stores;
  backward compute, 2× forward matmuls, backward HBM bytes and the unnamed recompute, for loads).
* peak = params + grads + AdamW moments + per group (every layer's carry + each device
  name, or the whole no-remat residual set where the group keeps its unnamed intermediates)
  + staging
  (one layer's offloaded slices of the group with most, two layers when pipelined)
  + one layer's workspace (its full residual set) — or, if larger, the loss's float32 logits, their
  gradient and the head's unsharded gradient in place of the workspace and embedding/head gradients.
* that is the ``policy`` mechanism (XLA's host offloader).  Under ``prefetch`` (tierax's
  scan, the default) every schedule but ``serial`` hides a copy under a whole layer's
  compute, one layer is always staged (the next layer's prefetched slices: the layer in use's
  are in its workspace); a value made before the attention is stored in its own layer (L on the
  host, L + 1 loads: its last layer before the loop, layer 0 twice), any other a layer later (its
  last layer stays on device: L − 1 on the host, but two slots in a two-layer group, L loads).
* a target with a scheduler limit (a TPU's): where a plan's peak is above it, no load hides.

Inventories are synthetic (two layer groups, DeepSeek-like: dense + MoE), with rates where
offload, remat and device each win somewhere, and device and host budgets that bind.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tierax import costmodel as cm
from tierax import names as N
from tierax import plan as plan_lib
from tierax.models import get_config
from tierax.solving import planner
from tierax.tracing.inventory import Activation, GroupInventory, Inventory
from tierax.tracing.model_program import for_inventory

MB = 2**20
CFG = get_config("tiny-deepseek")  # names and head shape only; the inventory below is synthetic
MICROBATCH, SEQ = 4, 64
# Names per group (real names of the model, so a Plan built from them resolves).
NAMES = {
    "dense": (N.QUERY_PROJ, N.KEY_PROJ, N.MLPWI_0, N.MLPWO),
    "moe": (N.VALUE_PROJ, N.ATTENTION_OUT, N.MOE_MLPWI_0, N.MOE_MLPWI_1),
}
SCHEDULES = ("serial", "lhs", "lhs-pipelined")
# The projections a layer makes before its attention (written out here, not imported)
MADE_BEFORE_ATTENTION = {"query_proj", "key_proj", "value_proj"}
# The schedule's documented hiding rule: fraction of the layer's compute a transfer hides under,
# and the layers of offloaded slices in flight.
HIDE = {"serial": 0.0, "lhs": 0.5, "lhs-pipelined": 1.0}
STAGE = {"serial": 1, "lhs": 1, "lhs-pipelined": 2}
# 8 placement codes (0 device, 1 offload, 2 remat), then per group whether its unnamed intermediates
# are kept (1: no remat, only with all four of its names on device) or recomputed (0)
CODES = np.array(
    [
        (*c, *k)
        for c in itertools.product(range(3), repeat=8)
        for k in itertools.product(range(2), repeat=2)
        if not (k[0] and any(c[:4])) and not (k[1] and any(c[4:]))
    ],
    dtype=np.int64,
)
INDEX = {tuple(row): i for i, row in enumerate(CODES.tolist())}
PLACEMENT = {
    0: plan_lib.Placement.DEVICE,
    1: plan_lib.Placement.OFFLOAD,
    2: plan_lib.Placement.REMAT,
}


def make_rates(link_d2h=20e9, link_h2d=16e9, matmul=1e12) -> cm.Rates:
    return cm.Rates("synthetic", matmul, 4e12, link_d2h, link_h2d, 450e9, 10**15, 10**15, True)


def make_inventory(groups: list[dict]) -> Inventory:
    """``groups``: dicts with layers, carry, extra (unnamed residual bytes/layer), base_flops,
    fwd_flops, the
    non-matmul HBM bytes per layer fwd_hbm, bwd_hbm, base_hbm, and items = [(bytes_per_layer,
    recompute_flops_per_layer, recompute_hbm_bytes_per_layer)] × 4."""
    out = []
    for gname, g in zip(("dense", "moe"), groups, strict=False):
        acts = [Activation(gname, N.DECODER_LAYER_INPUT, g["carry"], g["layers"], 0.0)]
        acts += [
            Activation(gname, n, b, g["layers"], f, h)
            for n, (b, f, h) in zip(NAMES[gname], g["items"], strict=False)
        ]
        save_all = g["carry"] + sum(b for b, *_ in g["items"]) + g["extra"]
        out.append(
            GroupInventory(
                gname,
                g["layers"],
                tuple(acts),
                g["carry"],
                save_all,
                g["base_flops"],
                g["fwd_flops"],
                layer_param_count=1000,
                forward_hbm_bytes_per_layer=g["fwd_hbm"],
                backward_hbm_bytes_per_layer=g["bwd_hbm"],
                base_recompute_hbm_bytes_per_layer=g["base_hbm"],
            )
        )
    return Inventory(
        "synthetic",
        MICROBATCH,
        SEQ,
        {"data": 1, "fsdp": 1},
        tuple(out),
        param_bytes=300 * MB,
        grad_bytes=300 * MB,
        optimizer_bytes=600 * MB,
        logits_bytes=MICROBATCH * SEQ * CFG.vocab_size * 4,
        embed_param_count=1000,
        loss_hbm_bytes=50 * MB,
    )


def brute_force(inv: Inventory, rates: cm.Rates, schedule: str, mechanism: str = "policy"):
    """(peak bytes, host bytes, step seconds) of every one of the 3^8 plans, from first
    principles; a plan that offloads in a one-layer group is not offered (infinite seconds)."""
    w, stage, prefetch = HIDE[schedule], STAGE[schedule], mechanism == "prefetch"
    if prefetch:
        w, stage = (0.0 if schedule == "serial" else 1.0), 1
    mm = rates.matmul_flops_per_s
    head_fwd = 2.0 * inv.microbatch * inv.seq * CFG.d_model * CFG.vocab_size
    fwd_all = sum(g.forward_flops_per_layer * g.num_layers for g in inv.groups) + head_fwd
    hbm = rates.hbm_bytes_per_s
    fixed_hbm = (
        sum(
            (g.forward_hbm_bytes_per_layer + g.backward_hbm_bytes_per_layer) * g.num_layers
            for g in inv.groups
        )
        + inv.loss_hbm_bytes
        + 7 * inv.param_bytes
    )  # AdamW reads params, grads, mu, nu; writes params, mu, nu
    seconds = np.full(
        len(CODES), 3.0 * fwd_all / mm + fixed_hbm / hbm
    )  # forward once, backward twice
    # The larger of two moments: a layer's backward (state + one layer's residuals) and the loss
    # (state less the embedding/head gradients, plus the head's float32 gradient and the float32
    # logits with their gradient).
    state = inv.param_bytes + inv.grad_bytes + inv.optimizer_bytes
    layer_phase = state + max(g.save_all_bytes_per_layer for g in inv.groups)
    loss_phase = (
        state - inv.embed_param_count * 4 + CFG.vocab_size * CFG.d_model * 4 + 2 * inv.logits_bytes
    )
    peak = np.full(len(CODES), max(layer_phase, loss_phase), dtype=np.int64)
    host = np.zeros(len(CODES), dtype=np.int64)
    staging = np.zeros(len(CODES), dtype=np.int64)
    col, stores, loads = 0, [], []
    not_offered = np.zeros(len(CODES), dtype=bool)
    for gi, g in enumerate(inv.groups):
        L = g.num_layers
        named = [a for a in g.activations if a.name != N.DECODER_LAYER_INPUT]
        c = CODES[:, col : col + len(named)]
        col += len(named)
        keep = CODES[:, 8 + gi] == 1  # only where every name is on device (CODES)
        b = np.array([a.bytes_per_layer for a in named], dtype=np.int64)
        f = np.array([a.recompute_flops_per_layer for a in named])
        h = np.array([a.recompute_hbm_bytes_per_layer for a in named])
        all_dev = keep  # no remat
        kept = g.carry_bytes_per_layer * L + ((c == 0) * b).sum(axis=1) * L
        peak += np.where(all_dev, g.save_all_bytes_per_layer * L, kept)
        recompute_flops = np.where(
            all_dev, 0.0, (g.base_recompute_flops_per_layer + ((c == 2) * f).sum(axis=1)) * L
        )
        recompute_hbm = np.where(
            all_dev, 0.0, (g.base_recompute_hbm_bytes_per_layer + ((c == 2) * h).sum(axis=1)) * L
        )
        seconds += recompute_flops / mm + recompute_hbm / hbm
        off_layer = ((c == 1) * b).sum(axis=1)
        # under prefetch, a value made before the attention is stored in its own layer (all L on
        # the host, L + 1 loads: its last layer's before the loop); any other a layer later (its
        # last layer stays on device: L − 1 on the host, L loads), its host stack two slots at
        # least in a group of two layers or more (a two-layer group's: one unwritten)
        own = np.array([a.name in MADE_BEFORE_ATTENTION for a in named])
        off_own = ((c == 1) * b * own).sum(axis=1)
        later_slots = L if not prefetch else (max(L - 1, 2) if L >= 2 else L - 1)
        host += off_own * L + (off_layer - off_own) * later_slots
        staging = np.maximum(staging, stage * off_layer)
        store_s = off_layer * L / rates.d2h_bytes_per_s
        load_s = (off_layer * L + (off_own if prefetch else 0)) / rates.h2d_bytes_per_s
        fwd_s = g.forward_flops_per_layer * L / mm + g.forward_hbm_bytes_per_layer * L / hbm
        bwd_s = (2 * g.forward_flops_per_layer + g.base_recompute_flops_per_layer) * L / mm + (
            g.backward_hbm_bytes_per_layer + g.base_recompute_hbm_bytes_per_layer
        ) * L / hbm
        stores.append(np.maximum(0.0, store_s - w * fwd_s))
        loads.append((load_s, np.maximum(0.0, load_s - w * bwd_s)))
        if L == 1:  # a one-layer group offloads nothing (XLA keeps such a value on device)
            not_offered |= (c == 1).any(axis=1)
    over = (peak + staging > rates.scheduler_limit_bytes) if rates.scheduler_limit_bytes else 0
    for store, (whole, beyond) in zip(stores, loads, strict=True):
        seconds += store + np.where(over, whole, beyond)
    return peak + staging, host, np.where(not_offered, np.inf, seconds)


def codes_of(plan: plan_lib.Plan) -> np.ndarray:
    r = plan_lib.resolve(plan, CFG)
    inverse = {v: k for k, v in PLACEMENT.items()}
    kept = plan_lib.unnamed_placements(plan, CFG)
    places = [inverse[r[g][n]] for g in ("dense", "moe") for n in NAMES[g]]
    keeps = [int(kept[g] is plan_lib.Placement.DEVICE) for g in ("dense", "moe")]
    return np.array(places + keeps, dtype=np.int64)


def index_of(codes: np.ndarray) -> int:
    return INDEX[tuple(int(c) for c in codes)]


def check(inv, rates, schedule, budget, host_budget, mechanism="policy"):
    """Plan with the MILP, compare with brute force; returns the optimal codes."""
    peak, host, seconds = brute_force(inv, rates, schedule, mechanism)
    ok = (peak <= budget) & (host <= host_budget) & np.isfinite(seconds)
    assert ok.any()
    # A scheduler limit below the budget: the fastest plan within it where one fits, else the
    # fastest within the budget (planner.preferred_budgets).
    limit = rates.scheduler_limit_bytes
    if limit and limit < budget and (ok & (peak <= limit)).any():
        ok &= peak <= limit
    best = int(np.flatnonzero(ok)[np.argmin(seconds[ok])])
    r = planner.plan(
        for_inventory(CFG, inv),
        rates,
        schedule=schedule,
        budget_bytes=budget,
        host_budget_bytes=host_budget,
        mechanism=mechanism,
        place_state=False,  # this reference prices activations only (tests/test_planner_state.py)
    )
    assert r.plan.mechanism == mechanism
    k = index_of(codes_of(r.plan))
    # The chosen plan, evaluated independently: within both budgets, and as fast as the best plan
    # there is.
    assert peak[k] <= budget and host[k] <= host_budget, (peak[k], budget, host[k], host_budget)
    assert seconds[k] == pytest.approx(seconds[best], rel=1e-5, abs=0), (CODES[k], CODES[best])
    # simulate's own prediction of that plan agrees with the first-principles numbers.
    assert r.predicted.peak_device_bytes == peak[k] and r.predicted.host_bytes == host[k]
    assert r.predicted.step_time_s == pytest.approx(seconds[k], rel=1e-9)
    return CODES[best], seconds, peak, host


def fixture_groups():
    """Hand-set DeepSeek-like inventory: big cheap-to-move MoE up-projections, costly attention,
    cheap MLP out."""
    # HBM bytes at 4 TB/s: 4 GB/layer is 1 ms, on the scale of the matmuls (1 GFLOP at 1 TFLOP/s = 1
    # ms).
    dense = dict(
        layers=3,
        carry=8 * MB,
        extra=6 * MB,
        base_flops=0.4e9,
        fwd_flops=6e9,
        fwd_hbm=2e9,
        bwd_hbm=5e9,
        base_hbm=0.8e9,
        items=[
            (32 * MB, 3e9, 1e9),
            (16 * MB, 1.5e9, 0.2e9),
            (48 * MB, 1.0e9, 3e9),
            (8 * MB, 0.05e9, 0.5e9),
        ],
    )
    moe = dict(
        layers=5,
        carry=8 * MB,
        extra=10 * MB,
        base_flops=0.8e9,
        fwd_flops=9e9,
        fwd_hbm=3e9,
        bwd_hbm=8e9,
        base_hbm=2e9,
        items=[
            (16 * MB, 2.5e9, 0.4e9),
            (24 * MB, 0.3e9, 1.5e9),
            (96 * MB, 4e9, 2e9),
            (96 * MB, 4e9, 6e9),
        ],
    )
    return [dense, moe]


FIXTURE_BUDGETS = [(q, h) for q in (0.05, 0.2, 0.4, 0.6, 0.8, 1.0) for h in (0.0, 0.25, 1.0)]


@pytest.fixture(scope="module")
def fixture_results():
    inv, rates = make_inventory(fixture_groups()), make_rates()
    out = []
    for schedule in SCHEDULES:
        peak, host, _ = brute_force(inv, rates, schedule)
        lo, hi = int(peak.min()), int(peak.max())
        total = int(host.max())
        for q, h in FIXTURE_BUDGETS:
            budget, host_budget = lo + int(q * (hi - lo)), int(h * total)
            feasible = ((peak <= budget) & (host <= host_budget)).any()
            if not feasible:
                continue
            codes, seconds, *_ = check(inv, rates, schedule, budget, host_budget)
            out.append((schedule, q, h, codes, seconds))
    return out


def test_fixture_milp_equals_brute_force_every_schedule_and_budget(fixture_results):
    assert {s for s, *_ in fixture_results} == set(SCHEDULES)
    assert len(fixture_results) >= 40


def test_fixtures_exercise_every_placement(fixture_results):
    seen = {PLACEMENT[int(c)] for *_, codes, _ in fixture_results for c in codes[:8]}
    assert seen == set(plan_lib.Placement), (
        f"placements never optimal: {set(plan_lib.Placement) - seen}"
    )
    # Offload wins somewhere under every hiding schedule, and loses to remat somewhere else.
    for schedule in ("lhs", "lhs-pipelined"):
        mine = [codes[:8] for s, _, _, codes, _ in fixture_results if s == schedule]
        assert any((c == 1).any() for c in mine) and any(
            (c == 2).any() and not (c == 1).any() for c in mine
        )


def test_fixture_budgets_bind(fixture_results):
    """The device budget and the host budget each change the optimum somewhere."""
    by = {(s, q, h): seconds for s, q, h, _, seconds in fixture_results}
    opt = {(s, q, h): codes for s, q, h, codes, _ in fixture_results}
    host_binds = any(
        not np.array_equal(opt[(s, q, 0.25)], opt[(s, q, 1.0)])
        for s, q, h in opt
        if h == 0.25 and (s, q, 1.0) in opt
    )
    device_binds = any(
        not np.array_equal(opt[(s, 0.4, h)], opt[(s, 1.0, h)])
        for s, q, h in opt
        if q == 0.4 and (s, 1.0, h) in opt
    )
    assert host_binds and device_binds
    assert by  # the seconds are used by the other tests' checks


def test_hiding_rule_of_each_schedule_matters():
    """Same inventory and budget: lhs beats serial (same memory, more hiding); pipelined beats lhs
    at some
    budget (more hiding) though its second staging layer costs memory."""
    inv, rates = make_inventory(fixture_groups()), make_rates()
    peak0, _, _ = brute_force(inv, rates, "serial")
    pipelined_wins = False
    for q in (0.2, 0.3, 0.5, 0.7):
        budget = int(peak0.min() + q * (peak0.max() - peak0.min()))
        times = {}
        for schedule in SCHEDULES:
            peak, _, seconds = brute_force(inv, rates, schedule)
            r = planner.plan(
                for_inventory(CFG, inv),
                rates,
                schedule=schedule,
                budget_bytes=budget,
                host_budget_bytes=10**12,
                mechanism="policy",
                place_state=False,
            )
            times[schedule] = r.predicted.step_time_s
            assert r.predicted.step_time_s == pytest.approx(seconds[peak <= budget].min(), rel=1e-7)
        assert times["serial"] > times["lhs"]
        pipelined_wins |= times["lhs-pipelined"] < times["lhs"] * (1 - 1e-6)
    assert pipelined_wins


def random_groups(rng):
    groups = []
    for _ in range(2):
        groups.append(
            dict(
                layers=int(rng.integers(1, 7)),
                carry=int(rng.integers(1, 16)) * MB,
                extra=int(rng.integers(0, 16)) * MB,
                base_flops=float(rng.uniform(0, 1e9)),
                fwd_flops=float(rng.uniform(1e9, 1.2e10)),
                items=[
                    (
                        int(rng.integers(1, 128)) * MB + int(rng.integers(0, 4096)),
                        float(rng.uniform(0, 5e9)),
                        float(rng.uniform(0, 8e9)),
                    )
                    for _ in range(4)
                ],
                fwd_hbm=float(rng.uniform(0, 8e9)),
                bwd_hbm=float(rng.uniform(0, 2e10)),
                base_hbm=float(rng.uniform(0, 4e9)),
            )
        )
    return groups


@pytest.mark.parametrize("seed", range(40))
def test_random_inventories_milp_equals_brute_force(seed):
    mechanism = ("policy", "prefetch")[seed % 2]
    rng = np.random.default_rng(seed)
    inv = make_inventory(random_groups(rng))
    rates = make_rates(
        link_d2h=float(rng.uniform(10e9, 200e9)),
        link_h2d=float(rng.uniform(10e9, 200e9)),
        matmul=float(rng.uniform(0.3e12, 2e12)),
    )
    for schedule in SCHEDULES:
        peak, host, seconds = brute_force(inv, rates, schedule, mechanism)
        for _ in range(2):
            budget = int(np.quantile(peak, rng.uniform(0.0, 1.0), method="lower"))
            host_budget = int(rng.uniform(0, 1) * host.max())
            if not ((peak <= budget) & (host <= host_budget) & np.isfinite(seconds)).any():
                host_budget = int(host.max())
            check(inv, rates, schedule, budget, host_budget, mechanism)


def test_prefetch_fixture_offloads_and_beats_the_policy_where_loads_would_show():
    """The default mechanism on the hand fixture: the MILP equals brute force at every budget,
    offload is
    chosen somewhere, and at a budget where XLA's policy (lhs) exposes loads the prefetching plan is
    faster."""
    inv, rates = make_inventory(fixture_groups()), make_rates(link_d2h=8e9, link_h2d=8e9)
    peak, host, _ = brute_force(inv, rates, "lhs", "prefetch")
    chosen, faster = [], False
    for q in (0.2, 0.4, 0.6):
        budget = int(peak.min() + q * (peak.max() - peak.min()))
        codes, seconds, *_ = check(inv, rates, "lhs", budget, int(host.max()), "prefetch")
        chosen.append(codes)
        pol = planner.plan(
            for_inventory(CFG, inv),
            rates,
            schedule="lhs",
            budget_bytes=budget,
            host_budget_bytes=int(host.max()),
            mechanism="policy",
            place_state=False,
        )
        faster |= seconds[index_of(codes)] < pol.predicted.step_time_s * (1 - 1e-6)
    assert any((c == 1).any() for c in chosen) and faster


@pytest.mark.parametrize("limit_q", [-0.1, 0.3, 0.5, 0.7])
def test_scheduler_limit_milp_equals_brute_force(limit_q):
    """A TPU-like scheduler limit (copies serialized above it): the MILP's binary for it equals the
    brute force at every budget, and the limit changes the optimum somewhere — a plan that hides
    its loads below the limit is not the best above it, nor the other way round."""
    import dataclasses

    inv = make_inventory(fixture_groups())
    base = make_rates(link_d2h=8e9, link_h2d=8e9)
    peak, host, _ = brute_force(inv, base, "lhs", "prefetch")
    limit = int(peak.min() + limit_q * (peak.max() - peak.min()))
    rates = dataclasses.replace(base, scheduler_limit_bytes=limit)
    changed = preferred = False
    for q in (0.2, 0.4, 0.6, 0.8, 1.0):
        budget = int(peak.min() + q * (peak.max() - peak.min()))
        codes, seconds, peaks, _ = check(inv, rates, "lhs", budget, int(host.max()), "prefetch")
        free, *_ = check(inv, base, "lhs", budget, int(host.max()), "prefetch")
        changed |= not np.array_equal(codes, free)
        # the limit preferred: the fastest plan within the budget is above it, the chosen below
        fits = peaks <= budget
        fastest = int(np.flatnonzero(fits)[np.argmin(seconds[fits])])
        preferred |= peaks[fastest] > limit >= peaks[index_of(codes)]
    assert changed
    # where no plan fits within the limit (limit_q < 0) the planner still plans, above it
    assert preferred == (limit_q > 0)
    # simulate's own step of plans above the limit and below it, against the brute force
    _, _, seconds = brute_force(inv, rates, "lhs", "prefetch")
    offloads = (CODES[:, :8] == 1).any(axis=1)
    above = np.flatnonzero(offloads & (peak > limit))[::97][:6]
    below = np.flatnonzero(offloads & (peak <= limit))[::97][:6]
    assert len(above) and (len(below) or limit_q < 0)
    prog = for_inventory(CFG, inv)
    for k in (*above, *below):
        placements = {
            (g, n): PLACEMENT[int(c)]
            for (g, n), c in zip(
                [(g, n) for g in ("dense", "moe") for n in NAMES[g]], CODES[k, :8], strict=True
            )
        }
        placements |= {
            (g, planner.UNNAMED): plan_lib.Placement.DEVICE
            if CODES[k, 8 + i]
            else plan_lib.Placement.REMAT
            for i, g in enumerate(("dense", "moe"))
        }
        plan = planner.placements_to_plan(placements, prog, "p", "", mechanism="prefetch")
        got = cm.simulate(plan, prog, rates, "lhs")
        assert got.step_time_s == pytest.approx(seconds[k], rel=1e-9), (k, peak[k] > limit)
