"""The costs of a plan that are linear in its placement indicators, built once per (program, rates,
schedule, mechanism, microbatches per update): the one encoding :func:`tierax.costmodel.evaluate`
and the planner's MILP (:mod:`tierax.solving.planner`) share.

A plan is an indicator vector over the columns (:class:`LinearTerms`):

* ``d_k, o_k, r_k``: activation k (a (layer group, name) of :func:`item_terms`) kept on the device,
  offloaded, rematerialised — exactly one is 1;
* ``z_g``: group g keeps its unnamed intermediates (no remat; only with every name on device);
* ``c_g``: group g's layer input (the scan carry) offloaded (explicit placements only: the
  planner keeps it on the device);
* ``x_j``: part j of the training state (:func:`tierax.costmodel.state.state_terms`) offloaded.

Each cost linear in them is a :class:`Row` (coefficients over the columns plus a constant): device
bytes of each peak phase, host bytes, seconds of recomputation per resource, each group's copies
each way.  What is not linear stays with the caller: the peak is the largest phase, a group's
staging the largest group's, a copy exposed only beyond its window, the collectives' exposure and
the interference (evaluate: ``max`` of the rows; the MILP: auxiliary variables bounded below by
the same rows).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tierax import names as N
from tierax import plan as plan_lib
from tierax.costmodel import kept_reads, transposes
from tierax.costmodel import state as state_cm
from tierax.costmodel.fixed import FixedTerms, fixed_terms
from tierax.costmodel.rates import Rates, for_program
from tierax.costmodel.terms import (
    GroupTerms,
    ItemTerms,
    group_terms,
    item_terms,
    staging_and_window,
)
from tierax.errors import TieraxError
from tierax.tracing import hbm
from tierax.tracing.program import Program


@dataclass(frozen=True, eq=False)
class Row:
    """A cost linear in the indicators: ``const + coef · x``."""

    coef: np.ndarray
    const: float = 0.0

    def __post_init__(self):
        self.coef.flags.writeable = False  # a built table is shared (build's last table)

    def at(self, x: np.ndarray) -> float:
        return self.const + float(self.coef @ x)

    def __add__(self, other: Row) -> Row:
        return Row(self.coef + other.coef, self.const + other.const)

    def __sub__(self, other: Row) -> Row:
        return Row(self.coef - other.coef, self.const - other.const)

    def __mul__(self, k: float) -> Row:
        return Row(self.coef * k, self.const * k)

    def plus(self, const: float) -> Row:
        return Row(self.coef, self.const + const)


@dataclass(frozen=True, eq=False)
class LinearTerms:
    """The column layout (offsets of each indicator block) and every linear row of one program."""

    items: tuple[ItemTerms, ...]
    groups: tuple[GroupTerms, ...]
    parts: tuple[state_cm.StateTerms, ...]
    ugroups: tuple[state_cm.StateGroupTerms, ...]
    fixed: FixedTerms
    rates: Rates  # for the program (its fused attention kernel)
    schedule: str
    mechanism: str
    grad_accum: int
    accumulator_bytes: int  # the float32 accumulator on device when kept (0: one microbatch)
    update_hbm_s: float  # the optimizer update's HBM time: once per step, not per microbatch
    accumulate_s: float  # the accumulator's additions per step (0: one microbatch)
    donated_bytes: int  # parameters and optimizer state: the step reuses them (no first touch)
    # --- device bytes ---
    activation_bytes: Row  # carries, kept names, no-remat extras (less offloaded carries)
    staging_bytes: tuple[Row, ...]  # per group: its staged layers of offloaded slices
    state_freed_bytes: Row  # moments and master weights offloaded: out of every phase
    accum_freed_bytes: Row  # the accumulator offloaded: out of the microbatches' phases
    update_staging_bytes: tuple[Row, ...]  # per state group: the streamed update's slices
    accum_staging_bytes: tuple[Row, ...]  # per state group: the accumulation's slices
    # --- host bytes ---
    activation_host_bytes: Row
    state_host_bytes: Row
    accum_host_bytes: Row
    # --- seconds (one microbatch) and work ---
    recompute_s: Row
    recompute_hbm_s: Row
    recompute_attention_s: Row
    recompute_collective_s: Row
    recompute_flops: Row  # the recomputed matmul seconds at the rate they were priced at
    d2h_s: tuple[Row, ...]  # per group: activations' stores (hidden under its d2h window)
    h2d_s: tuple[Row, ...]  # per group: loads
    transpose_s: Row  # CPU only
    # --- the training state's copies, per state group (hidden under its update / additions) ---
    update_h2d_s: tuple[Row, ...]
    update_d2h_s: tuple[Row, ...]
    accum_h2d_s: tuple[Row, ...]
    accum_d2h_s: tuple[Row, ...]
    state_h2d_bytes: Row
    state_d2h_bytes: Row
    # per group (FixedTerms.group_workspace_bytes' order): the bytes per layer of the names kept
    # on device that the group's backward reads from their stacks (tierax.costmodel.kept_reads);
    # empty where no group reads any
    kept_read_bytes: tuple[Row, ...] = ()
    # Whether a one-layer group's offloaded values are held in host memory in this program's step
    # (Program.one_layer_groups_offload): where not, the planner offers no offload there.
    one_layer_groups_offload: bool = True

    # Column offsets.
    @property
    def D(self) -> int:  # noqa: N802
        return 0

    @property
    def O(self) -> int:  # noqa: N802, E743
        return len(self.items)

    @property
    def R(self) -> int:  # noqa: N802
        return 2 * len(self.items)

    @property
    def Z(self) -> int:  # noqa: N802
        return 3 * len(self.items)

    @property
    def C(self) -> int:  # noqa: N802
        return 3 * len(self.items) + len(self.groups)

    @property
    def X(self) -> int:  # noqa: N802
        return 3 * len(self.items) + 2 * len(self.groups)

    @property
    def size(self) -> int:
        return self.X + len(self.parts)

    # Rows made of rows.
    @property
    def transfer_s(self) -> Row:
        """The activations' copies, both directions, every group."""
        return _sum(self.d2h_s + self.h2d_s, self.size)

    @property
    def state_transfer_s(self) -> Row:
        return _sum(
            self.update_h2d_s + self.update_d2h_s + self.accum_h2d_s + self.accum_d2h_s, self.size
        )

    @property
    def microbatch_phase_bytes(self) -> Row:
        """The microbatches' peak (the larger of the loss and layer phases) less the staging (the
        largest group's :attr:`staging_bytes`, added by the caller)."""
        return (self.activation_bytes - self.state_freed_bytes - self.accum_freed_bytes).plus(
            self.fixed.fixed_bytes + self.accumulator_bytes
        )

    def microbatch_phase_rows(self, assigned: bool = False) -> tuple[tuple[str, Row], ...]:
        """The microbatches' phases as (label, row), their peak the largest, less the staging (as
        :attr:`microbatch_phase_bytes`, which is their bound where no group reads kept names in
        place): each group's layer backward less the names it reads from their stacks
        (:mod:`tierax.costmodel.kept_reads`), after the layers' backward, the loss (``assigned``:
        without :attr:`FixedTerms.reported_excess_bytes`)."""
        fx = self.fixed
        if not self.kept_read_bytes:
            less = fx.fixed_bytes - fx.assigned_fixed_bytes if assigned else 0
            return (("microbatch phases", self.microbatch_phase_bytes.plus(-less)),)
        base = (self.activation_bytes - self.state_freed_bytes - self.accum_freed_bytes).plus(
            self.accumulator_bytes
        )
        rows = [
            (f"layer backward {name}", (base - read).plus(fx.layer_backward_bytes(ws)))
            for (name, ws), read in zip(fx.group_workspace_bytes, self.kept_read_bytes, strict=True)
        ]
        if fx.after_backward_bytes:
            after = fx.after_backward_bytes + fx.fixed_device_bytes
            rows.append(("after backward", base.plus(after)))
        loss = fx.loss_phase_bytes - (fx.reported_excess_bytes if assigned else 0)
        rows.append(("loss", base.plus(loss)))
        return tuple(rows)

    @property
    def update_phase_bytes(self) -> Row:
        """The streamed update's phase less its staging (the largest of
        :attr:`update_staging_bytes`)."""
        return (self.state_freed_bytes * -1).plus(
            self.fixed.state_bytes + self.fixed.fixed_device_bytes
        )

    @property
    def accumulation_phase_bytes(self) -> Row:
        """The accumulation's phase less its staging (the largest of :attr:`accum_staging_bytes`):
        the state and the accumulator left on device."""
        return (self.update_phase_bytes - self.accum_freed_bytes).plus(self.accumulator_bytes)

    def indicators(self, placements: Mapping, offloaded: set[tuple[str, str]]) -> np.ndarray:
        """The indicator vector of explicit placements ``{(group, name): Placement}`` (every
        activation's; ``(group, UNNAMED)`` and the carries may be absent) and the offloaded state
        parts ``{(group, kind)}``."""
        P = plan_lib.Placement
        x = np.zeros(self.size)
        column = {P.DEVICE: self.D, P.OFFLOAD: self.O, P.REMAT: self.R}
        for k, it in enumerate(self.items):
            x[column[placements[(it.group, it.name)]] + k] = 1
        for gi, g in enumerate(self.groups):
            names = [it.name for it in self.items if it.group == g.name]
            x[self.Z + gi] = keeps_unnamed(placements, g.name, names)
            x[self.C + gi] = placements.get((g.name, N.DECODER_LAYER_INPUT)) is P.OFFLOAD
        for j, part in enumerate(self.parts):
            x[self.X + j] = (part.group, part.kind) in offloaded
        return x

    @functools.cached_property
    def own_store_excess(self) -> tuple[Row, ...]:
        """Per group: the seconds by which its offloaded items' stores outlast their own windows
        (:func:`tierax.costmodel.terms.store_window_s`), item by item — linear in the plan; with
        the group's ``d2h_s`` less its window, the larger is what its stores expose
        (:func:`tierax.costmodel.terms.exposed_stores`)."""
        out = []
        for g in self.groups:
            coef = np.zeros(self.size)
            for k, it in enumerate(self.items):
                if it.group == g.name and it.d2h_s > it.d2h_window_s:
                    coef[self.O + k] = it.d2h_s - it.d2h_window_s
            out.append(Row(coef))
        return tuple(out)

    def state_cost(self, x: np.ndarray) -> state_cm.StateCost:
        """What the state placements of ``x`` add (:class:`tierax.costmodel.state.StateCost`):
        each group's copies exposed beyond its update's (the accumulator's: its additions') time,
        the slower direction's excess (:func:`tierax.costmodel.state.exposed`)."""
        exposed = 0.0
        for u, ug in enumerate(self.ugroups):
            exposed += state_cm.exposed(self.update_h2d_s[u].at(x), self.update_d2h_s[u].at(x), ug)
            exposed += state_cm.accum_exposed(
                self.accum_h2d_s[u].at(x), self.accum_d2h_s[u].at(x), ug
            )
        return state_cm.StateCost(
            int(self.state_freed_bytes.at(x)),
            int(self.state_host_bytes.at(x)),
            int(self.state_h2d_bytes.at(x)),
            int(self.state_d2h_bytes.at(x)),
            self.state_transfer_s.at(x),
            exposed,
            int(_largest(self.update_staging_bytes, x)),
            sum(g.update_device_s for g in self.ugroups),
            sum(g.update_host_s for g in self.ugroups),
            int(self.accum_freed_bytes.at(x)),
            int(self.accum_host_bytes.at(x)),
            int(_largest(self.accum_staging_bytes, x)),
        )


def _sum(rows: Sequence[Row], size: int) -> Row:
    out = Row(np.zeros(size))
    for r in rows:
        out = out + r
    return out


def _largest(rows: Sequence[Row], x: np.ndarray) -> float:
    return max((r.at(x) for r in rows), default=0.0)


def keeps_unnamed(placements: Mapping, group: str, names) -> bool:
    """Whether explicit ``placements`` keep ``group``'s unnamed intermediates (key ``(group,
    UNNAMED)``; absent: recomputed).

    Raises:
      TieraxError: they are kept while a name of the group is not on device.
    """
    P = plan_lib.Placement
    if placements.get((group, plan_lib.UNNAMED), P.REMAT) is not P.DEVICE:
        return False
    other = [n for n in names if placements[(group, n)] is not P.DEVICE]
    if other:
        raise TieraxError(
            f"group {group}: unnamed intermediates kept while {', '.join(other)} are not on device"
        )
    return True


# The table last built, with what it was built from: a brute-force search evaluates one program
# under many plans, and a Program and Rates are frozen values, so the same objects give the same
# rows (identity, not equality: comparing two programs field by field costs about a build).
_LAST: list = []


def build(
    prog: Program,
    rates: Rates,
    schedule: str,
    mechanism: str = plan_lib.DEFAULT_MECHANISM,
    grad_accum: int = 1,
) -> LinearTerms:
    """Every linear row of ``prog`` at ``rates`` under ``schedule`` and ``mechanism``, for a step
    of ``grad_accum`` microbatches per update (the same objects again: the table built last)."""
    if _LAST:
        last_prog, last_rates, last_key, table = _LAST
        key = (schedule, mechanism, grad_accum)
        if last_prog is prog and last_rates is rates and last_key == key:
            return table
    table = _build(prog, rates, schedule, mechanism, grad_accum)
    _LAST[:] = [prog, rates, (schedule, mechanism, grad_accum), table]
    return table


def _build(
    prog: Program, rates: Rates, schedule: str, mechanism: str, grad_accum: int
) -> LinearTerms:
    inv = prog.inventory
    rates = for_program(rates, prog)  # the fused attention kernel at the program's shape
    items = tuple(item_terms(inv, rates, mechanism, dict(prog.host_layout)))
    groups = tuple(group_terms(inv, rates, schedule, mechanism))
    parts, ugroups = state_cm.state_terms(prog, rates, grad_accum)
    staged_layers = staging_and_window(schedule, mechanism)[0]
    n, G = len(items), len(groups)
    D, O, R, Z, C, X = 0, n, 2 * n, 3 * n, 3 * n + G, 3 * n + 2 * G  # noqa: E741
    size = X + len(parts)

    def row(coeffs: Mapping[int, float] = {}, const: float = 0.0) -> Row:  # noqa: B006
        coef = np.zeros(size)
        for j, v in coeffs.items():
            coef[j] += v
        return Row(coef, const)

    gidx = {g.name: i for i, g in enumerate(groups)}
    mine = {g.name: [k for k, it in enumerate(items) if it.group == g.name] for g in groups}
    # An offloaded carry leaves the device and crosses the link like a named activation (XLA's
    # host offloader stores the scan's carry residuals: tests/test_compile.py).
    activation_bytes = row(
        {D + k: it.bytes for k, it in enumerate(items)}
        | {Z + i: g.save_all_extra_bytes for i, g in enumerate(groups)}
        | {C + i: -g.base_bytes for i, g in enumerate(groups)},
        sum(g.base_bytes for g in groups),
    )
    activation_host = row(
        {O + k: it.host_bytes for k, it in enumerate(items)}
        | {C + i: g.base_bytes for i, g in enumerate(groups)}
    )
    staging = tuple(
        row(
            {O + k: staged_layers * items[k].bytes_per_layer for k in mine[g.name]}
            | {C + i: staged_layers * (g.base_bytes // max(1, g.num_layers))}
        )
        for i, g in enumerate(groups)
    )
    d2h = tuple(
        row(
            {O + k: items[k].d2h_s for k in mine[g.name]}
            | {C + i: g.base_bytes / rates.d2h_bytes_per_s}
        )
        for i, g in enumerate(groups)
    )
    h2d = tuple(
        row(
            {O + k: items[k].h2d_s for k in mine[g.name]}
            | {C + i: g.base_bytes / rates.h2d_bytes_per_s}
        )
        for i, g in enumerate(groups)
    )

    # Recomputation: a group pays its unnamed base unless it keeps its unnamed intermediates
    # (z_g), plus each rematerialised name.
    def recompute(item_s, group_s) -> Row:
        return row(
            {R + k: item_s(it) for k, it in enumerate(items)}
            | {Z + i: -group_s(g) for i, g in enumerate(groups)},
            sum(group_s(g) for g in groups),
        )

    # the matmul seconds back to FLOPs at the rate each group's were priced at
    flop_rate = {
        g.name: rates.blended_matmul_rate(inv.group(g.name).matmul_min_dim_shares) for g in groups
    }
    recompute_flops = row(
        {
            R + k: (it.recompute_s - it.recompute_hbm_s) * flop_rate[it.group]
            for k, it in enumerate(items)
        }
        | {
            Z + i: -(g.base_recompute_s - g.base_recompute_hbm_s) * flop_rate[g.name]
            for i, g in enumerate(groups)
        },
        sum((g.base_recompute_s - g.base_recompute_hbm_s) * flop_rate[g.name] for g in groups),
    )
    # CPU: XLA:CPU's slow transposing fusions (tierax.costmodel.transposes): a name's reads from
    # the stacks where it is kept (offloaded counts as kept), every residual's without remat.
    tr: dict[int, float] = {}
    tr_const = 0.0
    for g in inv.groups:
        base, save_all, named = transposes.group_terms(g, rates)
        tr_const += base
        for k in mine[g.name]:
            s = named.get(items[k].name, 0.0)
            tr[D + k], tr[O + k] = s, s
        tr[Z + gidx[g.name]] = save_all - base - sum(named.values())
    # The training state.
    upd = [j for j, p in enumerate(parts) if p.kind in state_cm.ALL_PHASE_KINDS]
    acc = [j for j, p in enumerate(parts) if p.kind not in state_cm.ALL_PHASE_KINDS]

    def state_row(sel, attr, scale=1) -> Row:
        return row({X + j: scale * getattr(parts[j], attr) for j in sel})

    def per_ugroup(sel, attr) -> tuple[Row, ...]:
        return tuple(
            state_row([j for j in sel if parts[j].group == ug.group], attr) for ug in ugroups
        )

    everything = upd + acc
    fx = fixed_terms(prog, rates, schedule)
    return LinearTerms(
        items,
        groups,
        parts,
        ugroups,
        fx,
        rates,
        schedule,
        mechanism,
        grad_accum,
        state_cm.accumulator_bytes(prog, grad_accum),
        hbm.optimizer_bytes(inv.param_bytes) / rates.hbm_bytes_per_s,
        state_cm.accumulate_s(prog, rates, grad_accum),
        inv.param_bytes + inv.optimizer_bytes,
        activation_bytes,
        staging,
        state_row(upd, "device_bytes"),
        state_row(acc, "device_bytes"),
        per_ugroup(upd, "staging_bytes"),
        per_ugroup(acc, "staging_bytes"),
        activation_host,
        state_row(upd, "host_bytes"),
        state_row(acc, "host_bytes"),
        recompute(lambda it: it.recompute_s, lambda g: g.base_recompute_s),
        recompute(lambda it: it.recompute_hbm_s, lambda g: g.base_recompute_hbm_s),
        recompute(lambda it: it.recompute_attention_s, lambda g: g.base_recompute_attention_s),
        recompute(lambda it: 0.0, lambda g: g.base_recompute_collective_s),
        recompute_flops,
        d2h,
        h2d,
        row(tr, tr_const),
        per_ugroup(upd, "h2d_s"),
        per_ugroup(upd, "d2h_s"),
        per_ugroup(acc, "h2d_s"),
        per_ugroup(acc, "d2h_s"),
        state_row(everything, "h2d_bytes"),
        state_row(everything, "d2h_bytes"),
        _kept_reads(inv, rates, items, fx, row),
        one_layer_groups_offload=prog.one_layer_groups_offload,
    )


def _kept_reads(inv, rates, items, fx: FixedTerms, row) -> tuple[Row, ...]:
    """Per group of ``fx.group_workspace_bytes``: its kept names' reads from their stacks
    (:mod:`tierax.costmodel.kept_reads`); () where none (every other target, no such name)."""
    if not kept_reads.applies(rates) or not fx.group_workspace_bytes:
        return ()
    per = {  # column D + k, D = 0: the device indicators
        k: kept_reads.read_bytes_per_layer(inv, it.group, it.name) for k, it in enumerate(items)
    }
    if not any(per.values()):
        return ()
    return tuple(
        row({k: b for k, b in per.items() if b and items[k].group == name})
        for name, _ in fx.group_workspace_bytes
    )
