"""The joint planner (activations and training state in one MILP) against an independent brute force
over every plan: 3^8 activation placements × 2^4 state placements (moments, master weights of two
layer groups).

The activations' reference is tests/test_planner_bruteforce.py's first-principles model; the
state's is re-derived here from :mod:`tierax.costmodel.state`'s docstring, without calling it:
per group with ``P`` parameters per device, float32 parameters (4 bytes), AdamW moments 8 bytes per
parameter and a compute dtype of ``c`` bytes (float32, and bfloat16 with float32 masters),

* moments offloaded: ``8P`` bytes leave the device (both peak phases) and take host memory; the
  streamed update moves ``8P`` each way;
* master weights offloaded: ``(4 − c)·P`` bytes leave the device (nothing at float32 compute),
  ``4P`` host bytes, ``4P`` each way;
* per group, the copies beyond the group's update (``7·4P`` bytes at the HBM rate) are exposed,
  the two directions at once (the host link is full duplex: the slower direction's excess);
* a third peak phase, the update: the state left on device plus two layers' slices of the largest
  group's offloaded state;
* host bytes: the offloaded state plus the larger of the offloaded activations and the state (the
  update's second host buffer of the state, as XLA's deviceless compile allocates it).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from test_planner_bruteforce import (  # the activation reference
    CFG,
    CODES,
    brute_force,
    codes_of,
    fixture_groups,
    index_of,
    make_inventory,
    make_rates,
)

from tierax import plan as plan_lib
from tierax.solving import planner
from tierax.tracing.inventory import Inventory
from tierax.tracing.model_program import for_inventory

PARAMS = {"dense": 20_000_000, "moe": 50_000_000}  # per device; the rest is the embedding
PARTS = [(g, k) for g in ("dense", "moe") for k in ("moments", "master_weights")]
STATE_CODES = np.array(list(itertools.product((0, 1), repeat=len(PARTS))), dtype=np.int64)


def inventory() -> Inventory:
    inv = make_inventory(fixture_groups())
    return dataclasses.replace(
        inv, group_param_counts=tuple(PARAMS.items()), moment_bytes_per_param=8
    )


def state_reference(inv: Inventory, rates, compute_bytes: int = 4):
    """Per state code: (bytes freed, host bytes, exposed seconds, update-phase peak)."""
    layers = {g.name: g.num_layers for g in inv.groups}
    state_bytes = inv.param_bytes + inv.grad_bytes + inv.optimizer_bytes
    freed = np.zeros(len(STATE_CODES), dtype=np.int64)
    host = np.zeros(len(STATE_CODES), dtype=np.int64)
    exposed = np.zeros(len(STATE_CODES))
    staging = np.zeros(len(STATE_CODES), dtype=np.int64)
    for gname, P in PARAMS.items():
        window = 7 * 4 * P / rates.hbm_bytes_per_s
        moved = np.zeros(len(STATE_CODES))
        for j, (g, kind) in enumerate(PARTS):
            if g != gname:
                continue
            on = STATE_CODES[:, j]
            per_param = 8 if kind == "moments" else 4
            freed += on * (8 * P if kind == "moments" else (4 - compute_bytes) * P)
            host += on * per_param * P
            moved = moved + on * per_param * P
        up = moved / rates.h2d_bytes_per_s
        down = moved / rates.d2h_bytes_per_s
        exposed += np.maximum(0.0, np.maximum(up, down) - window)  # full duplex: at once
        staging = np.maximum(staging, (2 * moved / layers[gname]).astype(np.int64))
    return freed, host, exposed, state_bytes - freed + staging


def joint_brute_force(inv, rates, schedule, mechanism, compute_bytes=4):
    peak_a, host_a, sec_a = brute_force(inv, rates, schedule, mechanism)
    freed, host_s, exp_s, update_phase = state_reference(inv, rates, compute_bytes)
    peak = np.maximum(peak_a[:, None] - freed[None, :], update_phase[None, :])
    # The update writes the new state into a second host buffer, which shares memory with the
    # offloaded activations (dead by then): host = state + max(activations, state).
    host = host_s[None, :] + np.maximum(host_a[:, None], host_s[None, :])
    seconds = sec_a[:, None] + exp_s[None, :]
    return peak, host, seconds


def state_code(plan: plan_lib.Plan, parts=None) -> int:
    """The row of ``parts`` (default :data:`PARTS`) offloaded by ``plan``, as a state code."""
    parts = PARTS if parts is None else parts
    bits = [int(plan.state_of(g).placement(k) is plan_lib.Placement.OFFLOAD) for g, k in parts]
    return int(sum(b << (len(parts) - 1 - i) for i, b in enumerate(bits)))


CASES = [
    (link, schedule, q, h)
    for link in (20e9, 400e9)
    for schedule in ("serial", "lhs")
    for q in (0.0, 0.15, 0.3, 0.6, 1.0)
    for h in (0.1, 1.0)
]


# float32 masters under a bfloat16 compute dtype: offloading them frees 2 bytes a parameter.
BF16 = dataclasses.replace(CFG, dtype="bfloat16", param_dtype="float32")


def solve_cases(cfg, compute_bytes):
    inv = inventory()
    out = []
    for link, schedule, q, h in CASES:
        rates = make_rates(link_d2h=link, link_h2d=link * 0.8)
        mechanism = "policy"
        peak, host, seconds = joint_brute_force(inv, rates, schedule, mechanism, compute_bytes)
        lo, hi = int(peak.min()), int(peak.max())
        budget, host_budget = lo + int(q * (hi - lo)), int(h * host.max())
        ok = (peak <= budget) & (host <= host_budget)
        if not ok.any():
            continue
        best = np.unravel_index(np.argmin(np.where(ok, seconds, np.inf)), seconds.shape)
        r = planner.plan(
            for_inventory(cfg, inv),
            rates,
            schedule=schedule,
            budget_bytes=budget,
            host_budget_bytes=host_budget,
            mechanism=mechanism,
        )
        k, s = index_of(codes_of(r.plan)), state_code(r.plan)
        assert peak[k, s] <= budget and host[k, s] <= host_budget
        assert seconds[k, s] == pytest.approx(seconds[best], rel=1e-6), (
            (CODES[k], STATE_CODES[s]),
            (CODES[best[0]], STATE_CODES[best[1]]),
        )
        # simulate's prediction of the chosen plan agrees with the first-principles numbers.
        assert r.predicted.peak_device_bytes == pytest.approx(peak[k, s], abs=8)
        assert r.predicted.host_bytes == pytest.approx(host[k, s], abs=8)
        assert r.predicted.step_time_s == pytest.approx(seconds[k, s], rel=1e-9)
        out.append((link, schedule, q, h, STATE_CODES[best[1]], STATE_CODES[s]))
    return out


@pytest.fixture(scope="module")
def results():
    return solve_cases(CFG, 4)


@pytest.fixture(scope="module")
def results_bf16():
    return solve_cases(BF16, 2)


def test_joint_milp_equals_brute_force(results, results_bf16):
    assert len(results) >= 25 and len(results_bf16) >= 25


def test_bf16_fixtures_reach_master_weights_offloaded_and_kept(results_bf16):
    """With float32 masters under bfloat16 compute, offloading the master weights is optimal
    somewhere (the tightest budgets) and not elsewhere, per group."""
    chosen = [s for *_, s in results_bf16]
    masters = [j for j, (_, k) in enumerate(PARTS) if k == "master_weights"]
    assert any(s[masters].any() for s in chosen)
    assert any(not s[masters].any() for s in chosen)


def test_fixtures_reach_state_offloaded_and_kept(results):
    """Offloading the moments is optimal somewhere and not elsewhere; the master weights, which
    free nothing at float32 compute, are never offloaded."""
    chosen = [s for *_, s in results]
    moments = [j for j, (_, k) in enumerate(PARTS) if k == "moments"]
    masters = [j for j, (_, k) in enumerate(PARTS) if k == "master_weights"]
    assert any(s[moments].any() for s in chosen)
    assert any(not s.any() for s in chosen)
    assert not any(s[masters].any() for s in chosen)
    # Somewhere only one group's moments go: the choice is per group, not all or nothing.
    assert any(s[moments].sum() == 1 for s in chosen)


def test_state_offload_makes_a_plan_fit():
    """A budget below every activations-only plan's peak: only the state on host fits."""
    inv = inventory()
    rates = make_rates()
    peak_a, _, _ = brute_force(inv, rates, "lhs", "policy")
    budget = int(peak_a.min()) - 100 * 2**20
    with pytest.raises(planner.NoPlanFits):
        planner.plan(for_inventory(CFG, inv), rates, budget_bytes=budget, place_state=False)
    r = planner.plan(for_inventory(CFG, inv), rates, budget_bytes=budget, mechanism="policy")
    assert r.predicted.fits and r.plan.offloads_state
    assert r.predicted.peak_device_bytes <= budget
    rows = {e.name: e for e in r.explain if e.name.startswith("state:")}
    assert set(rows) == {"state:moments", "state:master_weights"}
    assert any(e.choice == "offload" and "frees" in e.why for e in r.explain)



def test_offloading_master_weights_makes_a_plan_fit():
    """float32 masters under a bfloat16 compute dtype: at a budget where a plan fits with
    everything recomputed and both kinds offloaded, but not with the moments alone, the planner
    offloads the master weights too (the step runs them) and says what they free."""
    from tierax import costmodel as cm
    from tierax.plan import Placement, StatePlacement

    inv = inventory()
    rates = make_rates()
    remat = {(i.group, i.name): Placement.REMAT for i in cm.item_terms(inv, rates)}
    groups = [g.name for g in inv.groups]

    def floor(**kinds):
        state = {g: StatePlacement(**kinds) for g in groups}
        pred = cm.evaluate(remat, for_inventory(BF16, inv), rates, "lhs", "policy", state)
        return pred.peak_device_bytes

    both = floor(moments=Placement.OFFLOAD, master_weights=Placement.OFFLOAD)
    moments_only = floor(moments=Placement.OFFLOAD)
    assert both < moments_only
    budget = (both + moments_only) // 2
    r = planner.plan(for_inventory(BF16, inv), rates, budget_bytes=budget, mechanism="policy")
    assert r.predicted.fits and r.predicted.peak_device_bytes <= budget
    assert any("master_weights" in sp.offloaded for sp in r.plan.state.values())
    rows = [e for e in r.explain if e.name == "state:master_weights" and e.choice == "offload"]
    assert rows and all("frees" in e.why for e in rows)
