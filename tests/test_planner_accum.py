"""The joint planner with gradient accumulation (``A`` microbatches per update) against an
independent brute force over every plan: 3^8 activation placements × 2^6 state placements
(moments, master weights and the gradient accumulator of two layer groups).

The activations' reference is tests/test_planner_bruteforce.py's first-principles model of one
microbatch; the rest is re-derived here from the mechanism (tierax.train.accumulate,
tierax.costmodel.state's docstring) without calling the cost model.  Per group with ``P``
float32 parameters per device and AdamW moments of 8 bytes a parameter:

* the step runs ``A`` microbatches (each the one-microbatch step less its AdamW update, ``7·4·N``
  bytes of HBM traffic for ``N`` parameters) and the update once, and adds each microbatch's
  gradients into the float32 accumulator: ``A·N·(4 + 4 + 4)`` bytes at the HBM rate;
* the accumulator (``4N`` bytes) is on the device through every microbatch; offloading a group's
  takes ``4P`` off the microbatches' phases (not the update's), puts ``4P`` on the host beside the
  offloaded activations (twice while it is added to), and moves ``(A + 1)·4P`` each way, the
  slower direction's excess over the group's additions (``A·P·12`` bytes at the HBM rate) exposed
  (the two directions run at once: the host link is full duplex);
* a fourth peak phase, the accumulation: the state and the accumulator left on device plus two
  layers' slices of the offloaded accumulator;
* moments and master weights as tests/test_planner_state.py has them.
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
    index_of,
    make_rates,
)
from test_planner_state import PARAMS, inventory, state_code

from tierax.solving import planner
from tierax.tracing.model_program import for_inventory

A = 3  # microbatches per update
PARTS = [(g, k) for g in ("dense", "moe") for k in ("moments", "master_weights", "grad_accum")]
STATE_CODES = np.array(list(itertools.product((0, 1), repeat=len(PARTS))), dtype=np.int64)
PER_PARAM = {"moments": 8, "master_weights": 4, "grad_accum": 4}


def reference(inv, rates, schedule, mechanism):
    """(peak, host bytes, step seconds) of every (activation code, state code)."""
    peak_a, host_a, sec_a = brute_force(inv, rates, schedule, mechanism)
    hbm = rates.hbm_bytes_per_s
    layers = {g.name: g.num_layers for g in inv.groups}
    params = inv.param_bytes // 4  # float32 parameters, every one per device
    update = 7 * inv.param_bytes / hbm
    state = inv.param_bytes + inv.grad_bytes + inv.optimizer_bytes
    accum = 4 * params
    n = len(STATE_CODES)
    freed, acc_freed = np.zeros(n, np.int64), np.zeros(n, np.int64)
    state_host, acc_host = np.zeros(n, np.int64), np.zeros(n, np.int64)
    exposed = np.zeros(n)
    stage_upd, stage_acc = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for gname, P in PARAMS.items():
        upd_moved = np.zeros(n)
        acc_moved = np.zeros(n)
        for j, (g, kind) in enumerate(PARTS):
            if g != gname:
                continue
            on = STATE_CODES[:, j]
            size = PER_PARAM[kind] * P
            if kind == "grad_accum":
                acc_freed += on * size
                acc_host += on * size
                acc_moved = acc_moved + on * (A + 1) * size
                stage_acc = np.maximum(stage_acc, on * 2 * size // layers[gname])
            else:
                freed += on * (size if kind == "moments" else 0)  # float32 compute: masters free 0
                state_host += on * size
                upd_moved = upd_moved + on * size
        upd_window = 7 * 4 * P / hbm
        acc_window = A * P * 12 / hbm
        for moved, window in ((upd_moved, upd_window), (acc_moved, acc_window)):
            slower = np.maximum(moved / rates.h2d_bytes_per_s, moved / rates.d2h_bytes_per_s)
            exposed += np.maximum(0.0, slower - window)  # full duplex: both directions at once
        stage_upd = np.maximum(stage_upd, (2 * upd_moved / layers[gname]).astype(np.int64))
    micro = peak_a[:, None] - freed[None, :] + (accum - acc_freed)[None, :]
    update_phase = state - freed + stage_upd
    accum_phase = np.where(stage_acc > 0, state - freed + accum - acc_freed + stage_acc, 0)
    peak = np.maximum(micro, np.maximum(update_phase, accum_phase)[None, :])
    temp = np.maximum(host_a[:, None] + acc_host[None, :], 2 * acc_host[None, :])
    temp = np.maximum(temp, state_host[None, :])
    host = np.where(
        (state_host + acc_host)[None, :] > 0, state_host[None, :] + temp, host_a[:, None]
    )
    seconds = (
        A * (sec_a[:, None] - update) + update + A * params * 12 / hbm + exposed[None, :]
    )
    return peak, host, seconds


CASES = [
    (link, schedule, q, h)
    for link in (20e9, 400e9)
    for schedule in ("serial", "lhs")
    for q in (0.0, 0.1, 0.3, 0.6, 1.0)
    for h in (0.15, 1.0)
]


@pytest.fixture(scope="module")
def results():
    inv = inventory()
    out = []
    for link, schedule, q, h in CASES:
        rates = make_rates(link_d2h=link, link_h2d=link * 0.8)
        peak, host, seconds = reference(inv, rates, schedule, "policy")
        lo, hi = int(peak.min()), int(peak.max())
        budget, host_budget = lo + int(q * (hi - lo)), int(h * host.max())
        ok = (peak <= budget) & (host <= host_budget)
        if not ok.any():
            continue
        best = np.unravel_index(np.argmin(np.where(ok, seconds, np.inf)), seconds.shape)
        r = planner.plan(
            for_inventory(CFG, inv),
            rates,
            schedule=schedule,
            budget_bytes=budget,
            host_budget_bytes=host_budget,
            mechanism="policy",
            grad_accum=A,
        )
        k, s = index_of(codes_of(r.plan)), state_code(r.plan, PARTS)
        assert peak[k, s] <= budget and host[k, s] <= host_budget
        assert seconds[k, s] == pytest.approx(seconds[best], rel=1e-6), (
            (CODES[k], STATE_CODES[s]),
            (CODES[best[0]], STATE_CODES[best[1]]),
        )
        # simulate's prediction of the chosen plan agrees with the first-principles numbers.
        assert r.predicted.peak_device_bytes == pytest.approx(peak[k, s], abs=8)
        assert r.predicted.host_bytes == pytest.approx(host[k, s], abs=8)
        assert r.predicted.step_time_s == pytest.approx(seconds[k, s], rel=1e-9)
        assert r.plan.grad_accum == A
        out.append(STATE_CODES[s])
    return out


def test_joint_milp_with_accumulation_equals_brute_force(results):
    assert len(results) >= 25


def test_fixtures_reach_the_accumulator_offloaded_and_kept(results):
    accum = [j for j, (_, k) in enumerate(PARTS) if k == "grad_accum"]
    assert any(s[accum].any() for s in results)
    assert any(not s[accum].any() for s in results)
    # Somewhere one group's accumulator goes and the other's stays: the choice is per group.
    assert any(s[accum].sum() == 1 for s in results)


def test_one_microbatch_has_no_accumulator_to_place():
    """With one microbatch per update the planner offers no accumulator, and simulate refuses a
    plan that offloads one (nothing accumulates)."""
    from tierax import costmodel as cm
    from tierax.errors import TieraxError

    inv = inventory()
    rates = make_rates()
    r = planner.plan(for_inventory(CFG, inv), rates, mechanism="policy")
    assert not [e for e in r.explain if e.name == "state:grad_accum"]
    plan = dataclasses.replace(r.plan, state={"dense": {"grad_accum": "offload"}})
    with pytest.raises(TieraxError, match="accumulates nothing"):
        cm.simulate(plan, for_inventory(CFG, inv), rates, "lhs")
    cm.simulate(plan, for_inventory(CFG, inv), rates, "lhs", grad_accum=2)  # priced with two
