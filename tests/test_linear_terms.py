"""The planner's MILP and ``evaluate`` read one table of linear rows
(:mod:`tierax.costmodel.linear_terms`); what each wraps around the rows is its own: evaluate takes
maxima (the largest phase and staging, copies beyond their windows, the collectives' exposure,
the host's peak), the MILP bounds auxiliaries below by the rows.  Over every plan of the planner's
brute-force enumeration (tests/test_planner_bruteforce.py: 6724 activation plans, every schedule
and mechanism; with the training state: test_planner_state's and test_planner_accum's parts in
every combination) the MILP's program at the plan — its indicator columns, each auxiliary at the
least its rows allow (what HiGHS chooses: every auxiliary costs) — gives evaluate's peak (the
largest device row), host bytes (the largest host row) and step time (the objective with its
constant), and satisfies every row.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from test_planner_bruteforce import CFG, CODES, NAMES, PLACEMENT, fixture_groups, make_inventory
from test_planner_bruteforce import make_rates as bruteforce_rates
from test_planner_state import inventory as state_inventory

from tierax import costmodel as cm
from tierax import names as N
from tierax import plan as plan_lib
from tierax.costmodel import linear_terms, predict
from tierax.models import get_config
from tierax.solving import planner
from tierax.tracing import model_program

GROUPS = ("dense", "moe")
slow = pytest.mark.slow


def placements_of(code) -> dict:
    """A brute-force code (8 placements, 2 unnamed-kept flags) as explicit placements."""
    names = [(g, n) for g in GROUPS for n in NAMES[g]]
    out = {key: PLACEMENT[int(c)] for key, c in zip(names, code[:8], strict=True)}
    for g, kept in zip(GROUPS, code[8:], strict=True):
        out[(g, plan_lib.UNNAMED)] = plan_lib.Placement.DEVICE if kept else plan_lib.Placement.REMAT
    return out


def tightest(milp: planner.Milp, x: np.ndarray) -> np.ndarray:
    """``x`` (plans × indicator columns) with each auxiliary at the least its bound 0 and its
    lower-bound rows allow, resolved in turn: an auxiliary is set from the rows where it is the
    last unresolved one (the copies' exposed seconds first, then the collectives' row that holds
    them: raising an exposed copy to lower the collectives saves nothing, both cost the same)."""
    nx, nv = x.shape[1], len(milp.c)
    v = np.zeros((len(x), nv))
    v[:, :nx] = x
    lower = [i for i in range(len(milp.rows)) if np.isinf(milp.hi[i]) and milp.rows[i, nx:].any()]
    todo = set(range(nx, nv))

    def alone(i: int, j: int) -> bool:
        return bool(milp.rows[i, j]) and not any(milp.rows[i, k] for k in todo - {j})

    while todo:
        ready = {j: [i for i in lower if alone(i, j)] for j in todo}
        ready = {
            j: rows for j, rows in ready.items() if rows or not any(milp.rows[i, j] for i in lower)
        }
        assert ready, "auxiliaries that bound each other"
        for j, rows in ready.items():
            least = np.zeros(len(x))
            for i in rows:
                rest = v @ milp.rows[i] - v[:, j] * milp.rows[i, j]
                least = np.maximum(least, (milp.lo[i] - rest) / milp.rows[i, j])
            v[:, j] = least
        todo -= set(ready)
    return v


def check_every_plan(prog, rates, schedule, mechanism, plans, grad_accum=1):
    """plans: (placements, state) pairs; asserts the MILP's numbers are evaluate's for each."""
    t = linear_terms.build(prog, rates, schedule, mechanism, grad_accum)
    milp = planner.build_milp(t, 1e30, 1e30)
    preds = [predict.evaluate_terms(t, p, s, prog) for p, s in plans]
    x = np.array([t.indicators(p, predict.offloaded_parts(s or {})) for p, s in plans])
    v = tightest(milp, x)
    lhs = v @ milp.rows.T
    assert (lhs >= milp.lo - 1e-9).all() and (lhs <= milp.hi + 1e-9).all()

    value = {label: lhs[:, i] * unit + const for label, i, unit, const in milp.budget_rows}
    peak = np.max([v for label, v in value.items() if label.startswith("device")], axis=0)
    host = np.max([v for label, v in value.items() if label.startswith("host")], axis=0)
    seconds = v @ milp.c / milp.scale + milp.constant_s
    for k, pred in enumerate(preds):
        b = pred.breakdown
        assert peak[k] == pytest.approx(pred.peak_device_bytes, rel=1e-12, abs=1), k
        assert host[k] == pytest.approx(pred.host_bytes, rel=1e-12, abs=1), k
        assert seconds[k] == pytest.approx(pred.step_time_s, rel=1e-8), k
        # each phase's row is the phase evaluate reports
        micro = max(b.layer_phase_bytes, b.loss_phase_bytes)
        micro_rows = ("device: microbatch", "device: layer", "device: after", "device: loss")
        phases = [v for label, v in value.items() if label.startswith(micro_rows)]
        assert np.max(phases, axis=0)[k] == pytest.approx(micro, abs=1), k
        if "device: update" in value:
            assert value["device: update"][k] == pytest.approx(b.update_phase_bytes, abs=1), k
        if b.state.accum_staging_bytes:  # a phase of its own only then
            got = value["device: accumulation"][k]
            assert got == pytest.approx(b.accumulation_phase_bytes, abs=1), k
    return preds


# Two cases by default (the serial collectives' row and the overlapped one, each mechanism's
# windows and staging); the other four repeat the same wrappers at other windows.
CASES = [
    pytest.param(s, m, marks=() if (s, m) in (("serial", "policy"), ("lhs", "prefetch")) else slow)
    for s in ("serial", "lhs", "lhs-pipelined")
    for m in ("policy", "prefetch")
]


@pytest.mark.parametrize("schedule, mechanism", CASES)
def test_milp_equals_evaluate_on_every_activation_plan(schedule, mechanism):
    inv, rates = make_inventory(fixture_groups()), bruteforce_rates()
    prog = model_program.for_inventory(CFG, inv)
    plans = [(placements_of(code), None) for code in CODES]
    preds = check_every_plan(prog, rates, schedule, mechanism, plans)
    # the enumeration reaches exposed copies, several peak phases' staging and no-remat groups
    assert any(p.breakdown.exposed_d2h_s > 0 for p in preds) or schedule != "serial"
    assert len({p.peak_device_bytes for p in preds}) > 100


@pytest.mark.parametrize("grad_accum", [1, 3])
def test_milp_equals_evaluate_with_the_training_state(grad_accum):
    """Every state placement (moments, master weights, with A > 1 the accumulator, per group)
    beside every 97th activation plan, bfloat16 compute (masters free bytes), the collectives'
    and copies' interference priced."""
    inv = state_inventory()
    rates = dataclasses.replace(bruteforce_rates(), overlap_slowdown=0.2)
    prog = model_program.for_inventory(dataclasses.replace(CFG, dtype="bfloat16"), inv)
    kinds = ("moments", "master_weights") + (("grad_accum",) if grad_accum > 1 else ())
    parts = [(g, k) for g in GROUPS for k in kinds]
    plans = []
    for code in CODES[::97]:
        for on in itertools.product((0, 1), repeat=len(parts)):
            state: dict = {}
            for (g, k), o in zip(parts, on, strict=True):
                if o:
                    state.setdefault(g, {})[k] = plan_lib.Placement.OFFLOAD
            sp = {g: plan_lib.StatePlacement(**ks) for g, ks in state.items()}
            plans.append((placements_of(code), sp))
    preds = check_every_plan(prog, rates, "lhs", "prefetch", plans, grad_accum)
    # the enumeration reaches state freed, staged and exposed, and an accumulation phase
    assert len({p.breakdown.update_phase_bytes for p in preds}) == 2 ** len(parts) // (
        1 if grad_accum == 1 else 2**2
    )
    assert any(p.breakdown.state.exposed_s > 0 for p in preds)
    assert any(p.breakdown.accumulation_phase_bytes for p in preds) == (grad_accum > 1)


def test_milp_equals_evaluate_where_collectives_and_copies_share_the_window():
    """A traced program with collectives (tiny-llama, fsdp=2 × tensor=2 on h100: tensor
    all-reduces on the critical path, FSDP gathers hidden under the compute the host copies leave,
    the interference priced): every third plan of its one layer group (and the all-device plan
    with its unnamed intermediates kept)."""
    cfg = get_config("tiny-llama")
    prog = model_program.program_of(cfg, 2, 64, {"fsdp": 2, "tensor": 2})
    rates = cm.target_rates("h100", cfg.dtype)
    group = prog.inventory.groups[0].name
    names = [
        a.name for a in prog.inventory.groups[0].activations if a.name != N.DECODER_LAYER_INPUT
    ]
    plans = []
    every = itertools.product(list(plan_lib.Placement), repeat=len(names))
    for code in itertools.islice(every, 0, None, 3):  # every third plan: 2187 of 6561
        placements = dict(zip([(group, n) for n in names], code, strict=True))
        keeps = [plan_lib.Placement.REMAT]
        if set(code) == {plan_lib.Placement.DEVICE}:
            keeps.append(plan_lib.Placement.DEVICE)
        plans += [(placements | {(group, plan_lib.UNNAMED): k}, None) for k in keeps]
    preds = check_every_plan(prog, rates, "lhs", "prefetch", plans)
    critical = preds[0].breakdown.critical_collective_s
    # the plans reach hideable collectives exposed, and hidden, by the copies' share of the window
    exposed = {p.breakdown.exposed_collective_s > critical * (1 + 1e-9) for p in preds}
    assert exposed == {True, False}
    assert all(p.breakdown.interference_s > 0 for p in preds)
