"""The planner: choose each activation's placement to minimise predicted step time.

An exact mixed-integer program over the cost model (:mod:`tierax.costmodel`),
solved with HiGHS through ``scipy.optimize.milp``:

* binaries ``d_i, o_i, r_i`` (device / offload / remat) per (layer group, activation),
  exactly one per item; ``z_g`` = group g keeps its unnamed intermediates (no remat:
  ``GroupPlan.unnamed: device``), allowed only when every activation of g is on device;
  with ``z_g`` = 0 an all-device group still recomputes its untagged values (MaxText's
  ``custom`` semantics);
* continuous exposed-transfer times per group and direction, and the staging bytes;
* minimise recomputation + exposed transfer time (compute and collectives are
  fixed) subject to device bytes ≤ budget and host bytes ≤ host budget.

The layer input (scan carry) is always on device.  Placements are per layer
group, or per segment where ``plan(segments=True)`` splits a group in two.  With
``one_placement_per_name`` every name takes the same placement in every group that
has it (``d`` and ``o`` equal across groups; MaxText sets each name once).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np
from scipy.optimize import Bounds, LinearConstraint

from tierax import costmodel as cm
from tierax import hardware
from tierax import names as N
from tierax.costmodel import linear_terms
from tierax.costmodel import state as state_cm
from tierax.costmodel.linear_terms import LinearTerms, Row
from tierax.errors import TieraxError
from tierax.plan import (
    DEFAULT_MECHANISM,
    UNNAMED,
    GroupPlan,
    Placement,
    Plan,
    Segment,
    StatePlacement,
    segment_name,
)
from tierax.sizes import size_text
from tierax.solving import quiet_milp
from tierax.tracing import inventory as inv_lib
from tierax.tracing import model_program
from tierax.tracing.model_program import takes_program
from tierax.tracing.program import Program

# Default reserve kept free on the device: the same runtime reserve `fits` means everywhere.
DEFAULT_RESERVE_FRACTION = hardware.RUNTIME_RESERVE_FRACTION


@dataclass(frozen=True)
class Explanation:
    group: str
    name: str
    bytes: int
    recompute_s: float
    transfer_s: float | None  # both directions; None: the target has no host link (CPU)
    hidden_fraction: float | None  # of this group's transfers, under the chosen plan
    choice: str
    why: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    predicted: cm.Prediction
    explain: tuple[Explanation, ...]
    budget_bytes: int
    host_budget_bytes: int
    microbatch: int
    # max_microbatch only: the search's upper guard when the microbatch reached it (a larger one
    # may fit too: the result is "at least this"); None when the search found where fitting stops.
    search_stopped_at: int | None = None
    # The device bytes the plan was chosen within: budget_bytes, or XLA:TPU's scheduler limit
    # below it (preferred_budgets); 0: budget_bytes.
    planned_within_bytes: int = 0

    def to_json(self) -> dict:
        out = {
            "plan": self.plan.to_dict(),
            "predicted": self.predicted.to_json(),
            "explain": [e.to_json() for e in self.explain],
            "budget_bytes": self.budget_bytes,
            "host_budget_bytes": self.host_budget_bytes,
            "planned_within_bytes": self.planned_within_bytes or self.budget_bytes,
            "microbatch": self.microbatch,
        }
        if self.search_stopped_at is not None:
            out["search_stopped_at"] = self.search_stopped_at
        return out


def budgets(
    rates: cm.Rates, budget_bytes: float | None, host_budget_bytes: float | None
) -> tuple[int, int]:
    dev = budget_bytes if budget_bytes is not None else rates.usable_device_bytes
    host = host_budget_bytes if host_budget_bytes is not None else rates.host_memory_bytes
    if not (math.isfinite(dev) and dev > 0 and math.isfinite(host) and host >= 0):
        raise TieraxError(
            f"device budget {dev!r} / host budget {host!r} bytes: give a finite "
            "device budget > 0 and a finite host budget ≥ 0"
        )
    return int(dev), int(host)


def scheduler_limit(rates: cm.Rates) -> int:
    """XLA:TPU's scheduler limit the planner works with where the target really offloads
    (:attr:`~tierax.costmodel.Rates.scheduler_limit_bytes`); 0: none."""
    return rates.scheduler_limit_bytes if rates.offload_is_real else 0


def preferred_budgets(rates: cm.Rates, budget: int) -> tuple[int, ...]:
    """The device budgets the planner tries, in order, taking the first that some plan fits: on a
    TPU target whose scheduler limit (:attr:`~tierax.costmodel.Rates.scheduler_limit_bytes`) is
    below ``budget``, that limit first.  Above it XLA:TPU issues the backward's loads where they are
    consumed and rematerialises on its own to stay within the device, neither of which the model
    prices beyond the loads: a plan there is run only where none fits within the limit."""
    limit = scheduler_limit(rates)
    return (limit, budget) if 0 < limit < budget else (budget,)


@dataclass(frozen=True, eq=False)
class Milp:
    """The planner's mixed-integer program over ``v``: the plan's indicator columns (those of
    :class:`~tierax.costmodel.linear_terms.LinearTerms`), then auxiliaries that make the model's
    maxima linear — per group the exposed store and load seconds (``ED``, ``EH``), the largest
    staging (``S``), per state group the update's and the accumulation's exposed copies (``UH``,
    ``AH``) and staging (``SU``, ``SA``), the exposed hideable collectives (``EC``) — each bounded
    below by the table's rows, so at the optimum it is the maximum that
    :func:`tierax.costmodel.evaluate` takes.

    ``lo ≤ rows · v ≤ hi``.  ``budget_rows``: (label, row, unit, constant) of each phase's device
    bytes and each host row: that row's bytes at ``v`` are ``rows[row] · v × unit + constant``.
    ``c · v / scale + constant_s`` is the predicted step time in seconds (the interference
    uncapped; the CPU's first touch as if the microbatches' phase peaked; tie-breaks of at most
    1e-9 of the compute time per column)."""

    terms: LinearTerms
    c: np.ndarray
    scale: float
    constant_s: float
    rows: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    budget_rows: tuple[tuple[str, int, float, float], ...]
    ub: np.ndarray
    aux: dict[str, int]  # the first column of each auxiliary block


def build_milp(
    t: LinearTerms,
    budget: float,
    host_budget: float,
    one_placement_per_name: bool = False,
    place_state: bool = True,
) -> Milp:
    """The program of the fastest plan within the budgets, stacked from ``t``'s rows (module
    docstring).  ``place_state`` False keeps the training state on the device."""
    items, groups, parts, ugroups, fx = t.items, t.groups, t.parts, t.ugroups, t.fixed
    A, nx, n, G, U = t.grad_accum, t.size, len(items), len(groups), len(ugroups)
    D, O, R, Z, C, X = t.D, t.O, t.R, t.Z, t.C, t.X  # noqa: E741
    ED, EH, S, UH, SU, EC, AH, SA, W, nv = map(int, np.cumsum([nx, G, G, 1, U, 1, 1, U, 1, 1]))
    # W = 1: the step's microbatch phases within the scheduler's limit, so the backward's loads
    # hide under their windows; 0: above it, every load exposed (costmodel.predict's
    # copies_serialized).  Only a TPU target has such a limit; elsewhere W stays 0, unused.
    sched_limit = scheduler_limit(t.rates)
    upd = [j for j, p in enumerate(parts) if p.kind in state_cm.ALL_PHASE_KINDS]
    acc = [j for j, p in enumerate(parts) if p.kind not in state_cm.ALL_PHASE_KINDS]
    # Units: seconds of the step's compute, bytes of all items' (with raw seconds and bytes, 1e-3
    # next to 1e9, HiGHS reported non-optimal plans as optimal).
    scale, total = 1.0 / max(fx.compute_s, 1e-30), max(1, sum(it.bytes for it in items))
    rows, lo, hi, budget_rows = [], [], [], []

    def wide(row: Row) -> np.ndarray:
        return np.concatenate([row.coef, np.zeros(nv - nx)])

    def add(coeffs: dict, lb: float, ub: float, base: np.ndarray | None = None):
        row = np.zeros(nv) if base is None else base
        for j, v in coeffs.items():
            row[j] += v
        rows.append(row), lo.append(lb), hi.append(ub)

    def at_least(row: Row, aux: int, unit: float, also=()):  # aux (+ also) ≥ row, in units
        add({aux: 1} | {j: 1 for j in also}, row.const / unit, np.inf, -wide(row) / unit)

    def at_most(row: Row, limit: float, label: str, aux: int | None = None):  # row + aux ≤ limit
        budget_rows.append((label, len(rows), total, row.const))
        extra = {} if aux is None else {aux: 1}
        add(extra, -np.inf, (limit - row.const) / total, wide(row) / total)

    for k in range(n):  # exactly one placement per activation
        add({D + k: 1, O + k: 1, R + k: 1}, 1, 1)
    own_excess = t.own_store_excess
    for gi, g in enumerate(groups):
        for k, it in enumerate(items):  # z_g ≤ d_k: keeping the unnamed needs every name kept
            if it.group == g.name:
                add({Z + gi: 1, D + k: -1}, -np.inf, 0)
        # the group's copies beyond their windows, and its staging
        at_least(t.d2h_s[gi].plus(-g.d2h_window_s), ED + gi, 1 / scale)
        if own_excess[gi].coef.any():  # e_d2h ≥ each store's excess over its own window
            at_least(own_excess[gi], ED + gi, 1 / scale)
        if sched_limit:  # e_h2d ≥ loads − window · W
            h2d = t.h2d_s[gi]
            add(
                {EH + gi: 1, W: g.h2d_window_s * scale},
                h2d.const * scale,
                np.inf,
                -wide(h2d) * scale,
            )
        else:
            at_least(t.h2d_s[gi].plus(-g.h2d_window_s), EH + gi, 1 / scale)
        at_least(t.staging_bytes[gi], S, total)
    # e_coll ≥ hideable − (compute + recompute − the copies' hidden seconds), the hidden seconds
    # being their total less e_d2h, e_h2d (tierax.costmodel.predict.exposed_collectives).
    hideable = Row(np.zeros(nx), fx.collective_s - fx.critical_collective_s)
    if t.schedule == "serial":
        at_least(hideable, EC, 1 / scale)
    else:
        window = (t.recompute_s - t.transfer_s).plus(fx.compute_s)
        at_least(hideable - window, EC, 1 / scale, also=range(ED, S))
    if one_placement_per_name:  # same name, another group: same placement
        first: dict[str, int] = {}
        for k, it in enumerate(items):
            if (j := first.setdefault(it.name, k)) != k:
                add({D + k: 1, D + j: -1}, 0, 0)
                add({O + k: 1, O + j: -1}, 0, 0)
        # MaxText's state switches are one per kind for every layer: the same in every group.
        first_kind: dict[str, int] = {}
        for j, part in enumerate(parts):
            if (i := first_kind.setdefault(part.kind, j)) != j:
                add({X + j: 1, X + i: -1}, 0, 0)
    # The streamed update's and the accumulation's copies per state group: one exposed variable
    # at least each direction's excess over the group's update (additions): the two directions run
    # at once on the full-duplex link (costmodel.state.exposed).
    for u, ug in enumerate(ugroups):
        for h2d, d2h, stage, E, SS, window in (
            (t.update_h2d_s, t.update_d2h_s, t.update_staging_bytes, UH, SU, ug.update_device_s),
            (t.accum_h2d_s, t.accum_d2h_s, t.accum_staging_bytes, AH, SA, ug.accumulate_device_s),
        ):
            if stage[u].coef.any() or h2d[u].coef.any():  # the group has parts of the kind
                at_least(h2d[u].plus(-window), E + u, 1 / scale)
                at_least(d2h[u].plus(-window), E + u, 1 / scale)
                at_least(stage[u], SS, total)
    # Device memory: each peak phase within the budget.  Host memory (costmodel.state.host_peak):
    # the offloaded activations, state and accumulator live together through a microbatch; the
    # update holds the state twice; the accumulator is held twice while it is added to.
    for label, phase in t.microbatch_phase_rows():
        at_most(phase, budget, f"device: {label}", S)
        if sched_limit:  # phase + staging ≤ the scheduler's limit where W = 1 (big M: the budget)
            big = max(budget, sched_limit) + phase.const
            add(
                {S: 1, W: big / total},
                -np.inf,
                (sched_limit + big - phase.const) / total,
                wide(phase) / total,
            )
    host = t.activation_host_bytes + t.state_host_bytes + t.accum_host_bytes
    at_most(host, host_budget, "host: microbatch")
    if upd:
        at_most(t.update_phase_bytes, budget, "device: update", SU)
        # the update's second buffer of the state: beside the activations' host buffers where
        # the compiler does not share them (XLA:TPU), in them otherwise
        update_host = t.state_host_bytes * 2
        if not t.rates.host_state_shares_activations:
            update_host = update_host + t.activation_host_bytes
        at_most(update_host, host_budget, "host: update")
    if acc:
        at_most(t.accumulation_phase_bytes, budget, "device: accumulation", SA)
        at_most(t.state_host_bytes + t.accum_host_bytes * 2, host_budget, "host: accumulation")

    # The objective: the step's seconds, in units of its compute time.  Compute that hides
    # collectives and host copies runs rates.overlap_slowdown slower (predict.interference_s):
    # linear, uncapped — the hidden collectives fit the window the hidden copies leave, so their
    # sum never exceeds the compute.
    slow = t.rates.overlap_slowdown
    per_micro = t.recompute_s + t.transpose_s + t.transfer_s * slow
    c = wide(per_micro) * A * scale
    c[ED:S] = c[EC] = A * (1 - slow)
    c[UH:SU] = c[AH:SA] = 1.0  # once per step
    constant_s = A * (fx.compute_s + fx.critical_collective_s + per_micro.const)
    constant_s += A * slow * hideable.const - (A - 1) * t.update_hbm_s + t.accumulate_s
    if t.rates.first_touch_bytes_per_s:
        # CPU: every byte of the peak but the donated state is faulted in once per step
        # (tierax.costmodel.first_touch); the microbatches' phase is linear in the columns.
        # Temporaries under malloc's mmap threshold, which simulate does not count, are priced
        # too: an error of at most that threshold at the first-touch rate, for steps that small.
        touch = 1 / t.rates.first_touch_bytes_per_s
        c += wide(t.microbatch_phase_bytes) * touch * scale
        c[S] += total * touch * scale
        constant_s += (t.microbatch_phase_bytes.const - t.donated_bytes) * touch
    # Tie-breaks: free memory when it costs nothing, do not use the link or move state for nothing.
    for k, it in enumerate(items):
        c[D + k] += 1e-9 * it.bytes / total
        c[O + k] += 1e-9 * it.bytes / total
    for j, part in enumerate(parts):
        c[X + j] += 1e-9 * part.host_bytes / max(1, sum(p.host_bytes for p in parts))
    ub = np.full(nv, np.inf)
    ub[:nx] = 1
    ub[C : C + G] = 0  # the layer input (scan carry) stays on the device
    ub[W] = 1 if sched_limit else 0
    for j, part in enumerate(parts):
        if not place_state or part.kind not in state_cm.PLANNED_KINDS:
            ub[X + j] = 0
    if not t.rates.offload_is_real:
        ub[O : O + n] = ub[X:nx] = 0
    # A one-layer group (or segment) of tierax's own step does not offload: XLA keeps the value
    # on device around its host copy (tierax.plan.one_layer_offloads), and resolve refuses such a
    # plan; a program whose front end applies the plan itself keeps the choice
    # (Program.one_layer_groups_offload).
    layers = {g.name: g.num_layers for g in groups}
    for k, it in enumerate(items):
        if layers[it.group] == 1 and not t.one_layer_groups_offload:
            ub[O + k] = 0
    aux = {"ED": ED, "EH": EH, "S": S, "UH": UH, "SU": SU, "EC": EC, "AH": AH, "SA": SA, "W": W}
    rows, lo, hi = np.array(rows), np.array(lo), np.array(hi)
    return Milp(t, c, scale, constant_s, rows, lo, hi, tuple(budget_rows), ub, aux)


def _solve(
    prog: Program,
    rates,
    schedule,
    budget,
    host_budget,
    one_placement_per_name: bool = False,
    mechanism: str = DEFAULT_MECHANISM,
    place_state: bool = True,
    grad_accum: int = 1,
) -> tuple[dict, dict] | None:
    """(activation placements, state placements) of the fastest plan within the budgets, or None:
    :func:`build_milp` of ``prog``'s linear terms, solved exactly.  ``place_state``: the training
    state's parts (:mod:`tierax.costmodel.state`) are columns of the same program;
    ``grad_accum`` = A > 1 microbatches per update (:func:`tierax.costmodel.evaluate`): the
    activations' costs count A times, the update's once."""
    t = linear_terms.build(prog, rates, schedule, mechanism, grad_accum)
    p = build_milp(t, budget, host_budget, one_placement_per_name, place_state)
    integrality = np.zeros(len(p.c))
    integrality[: t.size] = 1
    integrality[p.aux["W"]] = 1
    res = quiet_milp.milp(
        p.c,
        constraints=LinearConstraint(p.rows, p.lo, p.hi),
        integrality=integrality,
        bounds=Bounds(np.zeros(len(p.c)), p.ub),
        options={"mip_rel_gap": 0.0, "presolve": True},
    )
    if res.status != 0 or res.x is None:
        return None
    x = np.round(res.x).astype(int)
    P = Placement
    out = {
        (it.group, it.name): P.DEVICE if x[t.D + k] else P.OFFLOAD if x[t.O + k] else P.REMAT
        for k, it in enumerate(t.items)
    }
    out |= {(g.name, UNNAMED): P.DEVICE if x[t.Z + i] else P.REMAT for i, g in enumerate(t.groups)}
    state: dict = {}
    for j, part in enumerate(t.parts):
        if x[t.X + j]:
            state.setdefault(part.group, {})[part.kind] = P.OFFLOAD
    return out, {g: StatePlacement(**kinds) for g, kinds in state.items()}


def placements_to_plan(
    placements: dict,
    program,
    name: str,
    description: str,
    mechanism: str = DEFAULT_MECHANISM,
    splits: dict[str, int] | None = None,
    state: dict | None = None,
) -> Plan:
    """A Plan from solved placements; a group in ``splits`` (group → first layer of its second
    segment) gets two segments, each listing every name (placements keyed by segment name).
    ``state``: the solved training-state placements (group → StatePlacement).  ``program``: what
    the plan is for (its ``layer_groups()``)."""
    groups = {}
    for g in program.layer_groups():
        lin = (
            {N.DECODER_LAYER_INPUT: Placement.DEVICE}
            if N.DECODER_LAYER_INPUT in g.activations
            else {}
        )
        k = (splits or {}).get(g.name)
        if k is None:
            # a group that keeps its unnamed intermediates keeps every name (those the inventory
            # did not list, too)
            unnamed = placements.get((g.name, UNNAMED), Placement.REMAT)
            groups[g.name] = GroupPlan(
                lin | {n: p for (gn, n), p in placements.items() if gn == g.name and n != UNNAMED},
                unnamed,
                (),
                unnamed,
            )
            continue
        segs = tuple(_segment(placements, g, a, b) for a, b in ((0, k), (k, g.num_layers)))
        groups[g.name] = GroupPlan(lin, Placement.REMAT, segs)
    return Plan(name, groups, description, mechanism, state=state or {})


def _segment(placements: dict, g, a: int, b: int) -> Segment:
    """Layers a … b − 1 of group ``g`` as solved (keyed by segment name); a segment that keeps its
    unnamed intermediates keeps every name (those the inventory did not list, too)."""
    key = segment_name(g.name, a, b)
    unnamed = placements.get((key, UNNAMED))
    mine = {n: p for (gn, n), p in placements.items() if gn == key and n != UNNAMED}
    if unnamed is Placement.DEVICE:
        mine = {n: Placement.DEVICE for n in g.activations} | mine
    return Segment(a, b, mine, unnamed)


def _best_split(
    unsplit: tuple | None,
    prog: Program,
    rates,
    schedule,
    budget,
    host_budget,
    mechanism,
    place_state,
    grad_accum: int = 1,
):
    """((placements, state), the program they are keyed by, splits) of the fastest plan over
    every combination of one split point (or none) per group; ties keep fewer splits."""

    def seconds(solution, solved):
        placements, state = solution
        return cm.evaluate(
            placements, solved, rates, schedule, mechanism, state, grad_accum
        ).step_time_s

    best = (unsplit, prog, {}, seconds(unsplit, prog) if unsplit is not None else float("inf"))
    # Segments of one layer are not offered: XLA drops the host round trip of a value stored and
    # loaded without a loop between (seen in deviceless compiles, both mechanisms), so their offload
    # would be a no-op.
    choices = [[None, *range(2, g.num_layers - 1)] for g in prog.layer_groups()]
    names = [g.name for g in prog.layer_groups()]
    for combo in itertools.product(*choices):
        splits = {g: k for g, k in zip(names, combo, strict=False) if k is not None}
        if not splits:
            continue
        skeleton = placements_to_plan({}, prog, "split", "", mechanism, splits)
        solved = prog.for_plan(skeleton)
        placements = _solve(
            solved,
            rates,
            schedule,
            budget,
            host_budget,
            False,
            mechanism,
            place_state,
            grad_accum,
        )
        if placements is not None:
            s = seconds(placements, solved)
            if s < best[3] * (1 - 1e-9):
                best = (placements, solved, splits, s)
    return best[:3]


def _exposed(items, g) -> float:
    h2d = sum(i.h2d_s for i in items)
    return cm.exposed_stores(items, g) + max(0.0, h2d - g.h2d_window_s)


def _explain(
    placements,
    prog: Program,
    rates,
    schedule,
    pred: cm.Prediction,
    budget,
    host_budget,
    mechanism: str = DEFAULT_MECHANISM,
) -> tuple[Explanation, ...]:
    """Why each choice: its own costs, and what the alternatives would have cost given the rest of
    the plan."""
    inv = prog.inventory
    rates = cm.for_program(rates, prog)  # the fused attention kernel at the program's shape
    items = cm.item_terms(inv, rates, mechanism, dict(prog.host_layout))
    groups = {g.name: g for g in cm.group_terms(inv, rates, schedule, mechanism)}
    slack = budget - pred.peak_device_bytes
    ms = lambda s: f"{s * 1e3:.3g} ms"  # noqa: E731
    gib = lambda b: f"{b / 2**30:.3g} GiB"  # noqa: E731
    out = []
    for it in items:
        p = placements[(it.group, it.name)]
        g = groups[it.group]
        off = [
            i
            for i in items
            if i.group == it.group and placements[(i.group, i.name)] is Placement.OFFLOAD
        ]
        others = [i for i in off if i is not it]
        # Exposed time this item's transfers add to (or would add to) its group's transfers.
        marginal = _exposed(others + [it], g) - _exposed(others, g)
        with_it = others + [it]
        total = sum(i.d2h_s + i.h2d_s for i in with_it)
        hidden = 1.0 - _exposed(with_it, g) / total if total > 0 else 1.0
        # no offload offered (tierax.plan.one_layer_offloads)
        one_layer = g.num_layers == 1 and not prog.one_layer_groups_offload
        if p is Placement.DEVICE:
            why = (
                f"kept: {gib(it.bytes)} fits the budget ({gib(slack)} to spare); remat would cost "
                f"{ms(it.recompute_s)}, "
                + (
                    "offloading is not offered in a one-layer group"
                    if one_layer
                    else f"offload {ms(marginal)} exposed"
                    if rates.offload_is_real
                    else "offloading is a no-op on this backend"
                )
            )
        elif p is Placement.REMAT:
            if it.recompute_s == 0:
                why = "recompute is free: not needed by the backward pass, or recomputed anyway"
            elif one_layer:
                why = (
                    f"recomputed for {ms(it.recompute_s)} to free {gib(it.bytes)}; offloading is "
                    "not offered in a one-layer group (XLA keeps the value on device there)"
                )
            elif not rates.offload_is_real:
                why = (
                    f"recomputed for {ms(it.recompute_s)} to free {gib(it.bytes)}; offloading is a "
                    "no-op on this backend"
                )
            elif pred.host_bytes + it.bytes > host_budget:
                why = (
                    f"recomputed for {ms(it.recompute_s)} to free {gib(it.bytes)}; host memory has "
                    f"no room ({gib(host_budget - pred.host_bytes)} left)"
                )
            else:
                why = (
                    f"recomputed for {ms(it.recompute_s)} to free {gib(it.bytes)}: offloading it "
                    f"too would expose {ms(marginal)} more transfer time (the link is the limit)"
                )
        else:
            why = (
                f"offloaded: {hidden:.0%} of the group's transfers hide under compute, "
                f"{ms(marginal)} exposed by this one, vs {ms(it.recompute_s)} to recompute; frees "
                f"{gib(it.bytes)} of device memory"
            )
        out.append(
            Explanation(
                it.group,
                it.name,
                it.bytes,
                it.recompute_s,
                # no host link to price (XLA:CPU keeps "offloaded" values on the device)
                it.d2h_s + it.h2d_s if rates.offload_is_real else None,
                hidden if rates.offload_is_real else None,
                p.value,
                why,
            )
        )
    return tuple(out)


class NoPlanFits(TieraxError):
    """No placement of the activations fits the budgets (the message gives the floor)."""


# What a NoPlanFits message suggests, in the caller's terms (the Python API passes its own).
CLI_REMEDIES = (
    "Use a smaller --microbatch or --seq, more devices (--devices/--mesh), a larger "
    "--budget-gib, or --max-microbatch"
)

# --max-microbatch already searched every microbatch: even 1 does not fit
MAX_MICROBATCH_REMEDIES = (
    "Even microbatch 1 does not fit: use a smaller --seq, more devices (--devices/--mesh) or a "
    "larger --budget-gib"
)


@takes_program(0)
def plan(
    prog: Program,
    rates: cm.Rates,
    *,
    schedule: str = "lhs",
    budget_bytes: float | None = None,
    host_budget_bytes: float | None = None,
    name: str = "planned",
    one_placement_per_name: bool = False,
    mechanism: str = DEFAULT_MECHANISM,
    segments: bool = False,
    remedies: str | None = None,
    place_state: bool = True,
    grad_accum: int = 1,
) -> PlanResult:
    """The fastest predicted plan within the budgets (``one_placement_per_name``: the same across
    groups), for the offload ``mechanism`` the returned plan runs with.  ``segments``: also consider
    splitting each layer group at one layer boundary into two runs of layers with their own
    placements — every split point of every group (all combinations), each solved exactly; the
    fastest plan wins (an unsplit plan on ties).  ``remedies``: what a NoPlanFits message suggests
    (default: CLI options).  ``place_state``: choose the training state's placements (AdamW
    moments, master weights and, with ``grad_accum`` > 1 microbatches per update, the gradient
    accumulator: :mod:`tierax.costmodel.state`) in the same program as the activations'; False
    keeps all of it on device.

    Raises:
      TieraxError: no placement fits (the message gives the smallest peak possible).
    """
    if schedule not in cm.SCHEDULES:
        raise TieraxError(
            f"unknown schedule {schedule!r}; choose one of: {', '.join(cm.SCHEDULES)}"
        )
    budget, host_budget = budgets(rates, budget_bytes, host_budget_bytes)
    for within in preferred_budgets(rates, budget):
        solved, splits = prog, {}
        solution = _solve(
            prog,
            rates,
            schedule,
            within,
            host_budget,
            one_placement_per_name,
            mechanism,
            place_state,
            grad_accum,
        )
        if segments and not one_placement_per_name:
            solution, solved, splits = _best_split(
                solution,
                prog,
                rates,
                schedule,
                within,
                host_budget,
                mechanism,
                place_state,
                grad_accum,
            )
        if solution is not None:
            break
    if solution is None:
        from tierax.solving import no_fit

        raise NoPlanFits(
            no_fit.message(
                prog,
                rates,
                schedule,
                mechanism,
                budget,
                host_budget,
                place_state=place_state,
                grad_accum=grad_accum,
                remedies=remedies or CLI_REMEDIES,
            )
        )
    placements, state = solution
    desc = f"planned for {rates.target}, schedule {schedule}, device budget {size_text(budget)}"
    if within < budget:
        desc += f", within XLA:TPU's scheduler limit {size_text(within)}"
    p = placements_to_plan(placements, prog, name, desc, mechanism, splits, state)
    p = dataclasses.replace(p, planned_for=p.planned_for.replace(grad_accum=grad_accum))
    pred = cm.simulate(p, prog, rates, schedule, grad_accum)
    why = _explain(
        placements, solved, rates, schedule, pred, within, host_budget, mechanism
    ) + _explain_state(state, solved, rates, pred, within, host_budget, place_state, grad_accum)
    return PlanResult(
        p, pred, why, budget, host_budget, prog.microbatch, planned_within_bytes=within
    )


def _explain_state(
    state: dict,
    prog: Program,
    rates,
    pred: cm.Prediction,
    budget,
    host_budget,
    placed: bool,
    grad_accum: int = 1,
) -> tuple[Explanation, ...]:
    """Why each part of the training state is where it is: the bytes it frees, its streamed
    copies, how much of them its group's update (the accumulator: its additions) hides, and the
    update's time on the host."""
    parts, ugroups = state_cm.state_terms(prog, rates, grad_accum)
    ug = {g.group: g for g in ugroups}
    ms = lambda s: f"{s * 1e3:.3g} ms"  # noqa: E731
    gib = lambda b: f"{b / 2**30:.3g} GiB"  # noqa: E731
    # The offloaded activations' host bytes (pred's host bytes are state_cm.host_peak of them and
    # the state's; at most the state, they do not change the peak with more state offloaded).
    state_host = pred.breakdown.state.host_bytes
    accum_host = pred.breakdown.state.accum_host_bytes
    acts_host = max(0, pred.breakdown.activation_host_bytes)
    shares = rates.host_state_shares_activations
    out = []
    for part in parts:
        g = ug[part.group]
        sp = state.get(part.group, StatePlacement())
        accum = part.kind not in state_cm.ALL_PHASE_KINDS  # its copies hide under its additions
        off = [
            q
            for q in parts
            if q.group == part.group
            and q.kind in sp.offloaded
            and (q.kind not in state_cm.ALL_PHASE_KINDS) == accum
        ]
        others = [q for q in off if q is not part]
        rule = state_cm.accum_exposed if accum else state_cm.exposed

        def exposed(qs, g=g, rule=rule):
            return rule(sum(q.h2d_s for q in qs), sum(q.d2h_s for q in qs), g)

        marginal = exposed(others + [part]) - exposed(others)
        total = part.h2d_s + part.d2h_s
        with_it = others + [part]
        moved = sum(q.h2d_s + q.d2h_s for q in with_it)
        hidden = 1.0 - exposed(with_it) / moved if moved > 0 else 1.0
        host_note = (
            f"; an update on the host would take {ms(g.update_host_s)} at its memory bandwidth"
            if g.update_host_s
            else ""
        )
        name = f"state:{part.kind}"
        if sp.placement(part.kind) is Placement.OFFLOAD and accum:
            why = (
                f"offloaded: frees {gib(part.device_bytes)} of device memory through every "
                f"microbatch ({gib(part.host_bytes)} on the host); the {grad_accum} microbatches' "
                f"accumulation moves it {grad_accum + 1} times each way ({ms(total)}), "
                f"{hidden:.0%} hidden under the additions, {ms(marginal)} exposed"
            )
        elif sp.placement(part.kind) is Placement.OFFLOAD:
            why = (
                f"offloaded: frees {gib(part.device_bytes)} of device memory "
                f"({gib(part.host_bytes)} on the host); the streamed update moves it both ways "
                f"({ms(total)}), {hidden:.0%} hidden under the group's update, {ms(marginal)} "
                f"exposed, none under the backward pass{host_note}"
            )
        elif not placed:
            why = "kept: the planner was asked to keep the training state on device"
        elif part.kind not in state_cm.PLANNED_KINDS:
            why = (
                f"kept: the step does not run {part.kind} offloaded yet (priced only: offloading "
                f"would free {gib(part.device_bytes)}), so the planner does not choose it"
            )
        elif not rates.offload_is_real:
            why = "kept: offloading is a no-op on this backend"
        elif part.device_bytes == 0:
            why = "kept: offloading frees nothing here (the parameter dtype is the compute dtype)"
        elif (
            state_cm.host_peak(acts_host, state_host, accum_host + part.host_bytes, shares=shares)
            if accum
            else state_cm.host_peak(
                acts_host, state_host + part.host_bytes, accum_host, shares=shares
            )
        ) > host_budget:
            why = (
                f"kept: host memory has no room for its {gib(part.host_bytes)} "
                f"({gib(host_budget - pred.host_bytes)} left)"
            )
        else:
            why = (
                f"kept: {gib(part.device_bytes)} fits the budget "
                f"({gib(budget - pred.peak_device_bytes)} to spare); offloading would expose "
                f"{ms(marginal)} of "
                + ("accumulator copies" if accum else "streamed copies")
                + ("" if accum else host_note)
            )
        out.append(
            Explanation(
                part.group,
                name,
                part.device_bytes,
                0.0,
                total if rates.offload_is_real else None,  # no link where offload is a no-op
                hidden if rates.offload_is_real else None,
                sp.placement(part.kind).value,
                why,
            )
        )
    return tuple(out)


def _scaled(
    inv1: inv_lib.Inventory, inv2: inv_lib.Inventory, mb: int, mb1: int = 1, mb2: int = 2
) -> inv_lib.Inventory:
    """Inventory at microbatch ``mb`` by linear extrapolation from ``inv1`` and ``inv2`` traced at
    microbatches ``mb1`` and ``mb2`` (default: 1 and 2): the fields that grow with the microbatch
    (the inventory's pytree leaves: :data:`tierax.tracing.inventory.PER_MICROBATCH`), every other
    field ``inv1``'s."""
    t = (mb - mb1) / (mb2 - mb1)

    def lin(a, b):
        return type(a)(round(a + (b - a) * t)) if isinstance(a, int) else a + (b - a) * t

    inv2_on_1 = jax.tree.unflatten(jax.tree.structure(inv1), jax.tree.leaves(inv2))
    return jax.tree.map(lin, inv1, inv2_on_1)


# The doubling search's guard: far past any per-device microbatch a step runs (a microbatch this
# large that fits is reported as "at least" it, never as the largest).
MAX_MICROBATCH_SEARCH = 1 << 20


def largest_fitting(fits: Callable[[int], bool], bound: int) -> int:
    """The largest microbatch in 1..``bound`` that ``fits``, found by doubling from 1 until one
    does not fit (or ``bound`` is passed), then bisecting; each microbatch asked at most once.
    ``fits`` must be monotone (a smaller microbatch fits where a larger one does); 0 where 1 does
    not fit (or ``bound`` < 1)."""
    if bound < 1 or not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= bound and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, bound + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def max_microbatch(
    cfg,
    seq: int,
    mesh: dict,
    rates: cm.Rates,
    *,
    schedule: str = "lhs",
    budget_bytes=None,
    host_budget_bytes=None,
    limit: int | None = None,
    one_placement_per_name: bool = False,
    mechanism: str = DEFAULT_MECHANISM,
    place_state: bool = True,
) -> PlanResult:
    """The largest per-device microbatch any plan fits, and the best plan for it
    (``place_state``: as :func:`plan`).

    Bounded analytically first: every layer's input stays on the device under every placement,
    so no microbatch above ``budget / (layer inputs of one sequence)`` fits.  Within that bound it
    doubles from 1 until a microbatch does not fit, then bisects, on inventories extrapolated
    from microbatches 1 and 2 (activations ∝ batch); the answer is confirmed on real traces (MoE
    capacity rounding makes the extrapolation approximate): where the extrapolated largest does
    not fit, it gallops down (1, 2, 4, … below) to one that does and bisects between them, each
    microbatch traced once.  ``limit`` only guards the search (default
    :data:`MAX_MICROBATCH_SEARCH`): a result that reaches it carries ``search_stopped_at=limit``
    ("at least ``limit``").
    """
    limit = MAX_MICROBATCH_SEARCH if limit is None else limit
    inv1 = inv_lib.model_inventory(cfg, 1, seq, mesh)
    inv2 = inv_lib.model_inventory(cfg, 2, seq, mesh)
    at = model_program.for_inventory  # tierax's front end: the program at each microbatch
    budget, host_budget = budgets(rates, budget_bytes, host_budget_bytes)
    # The analytical bound: one sequence's layer inputs, on the device under every placement.
    carry1 = sum(g.carry_bytes_per_layer * g.num_layers for g in inv1.groups)
    bound = min(limit, budget // carry1) if carry1 > 0 else limit
    traced = {1: inv1, 2: inv2}

    def real(mb: int) -> inv_lib.Inventory:  # each microbatch traced once
        if mb not in traced:
            traced[mb] = inv_lib.model_inventory(cfg, mb, seq, mesh)
        return traced[mb]

    def solves(inv) -> bool:
        return (
            _solve(
                at(cfg, inv),
                rates,
                schedule,
                budget,
                host_budget,
                one_placement_per_name,
                mechanism,
                place_state,
            )
            is not None
        )

    def fits(mb: int) -> bool:
        return solves(inv1 if mb == 1 else inv2 if mb == 2 else _scaled(inv1, inv2, mb))

    lo = largest_fitting(fits, bound)
    if lo == 0:
        return plan(
            at(cfg, inv1),
            rates,
            schedule=schedule,
            budget_bytes=budget,
            host_budget_bytes=host_budget,
            one_placement_per_name=one_placement_per_name,
            mechanism=mechanism,
            place_state=place_state,
            remedies=MAX_MICROBATCH_REMEDIES,
        )
    stopped = limit if lo >= limit else None
    if lo > 2 and not solves(real(lo)):
        # Extrapolate again from two real traces near the answer (lo and lo/2), bisect on that,
        # then confirm on real traces: gallop from the estimate (1, 2, 4, … away) and bisect.
        half, bad = lo // 2, lo
        a, b = real(half), real(lo)
        good, hi = 1, lo
        while hi - good > 1:
            mid = (good + hi) // 2
            good, hi = (mid, hi) if solves(_scaled(a, b, mid, half, lo)) else (good, mid)
        start, step = good, 1
        if solves(real(start)):
            while start + step < bad and solves(real(start + step)):
                good, step = start + step, step * 2
            bad = min(bad, start + step)
        else:
            bad = start
            while True:
                good = max(1, start - step)
                if good == 1 or solves(real(good)):
                    break
                bad, step = good, step * 2
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if solves(real(mid)) else (good, mid)
        lo, stopped = good, None
    found = plan(
        at(cfg, real(lo)),
        rates,
        schedule=schedule,
        budget_bytes=budget,
        host_budget_bytes=host_budget,
        name=f"planned-mb{lo}",
        one_placement_per_name=one_placement_per_name,
        mechanism=mechanism,
        place_state=place_state,
    )
    return dataclasses.replace(found, search_stopped_at=stopped)
