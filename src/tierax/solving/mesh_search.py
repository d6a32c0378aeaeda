"""``tierax plan --mesh auto``: the mesh (data × fsdp × tensor × expert) chosen with the placement.

**Candidates.** Every factorisation of the device count into the four axes that the model admits
(:meth:`tierax.mesh.MeshShape.check_model`: tensor divides the heads, key/value heads and MLP
widths; expert divides the routed experts; the FSDP group fsdp × expert divides d_model).  For a
model without routed experts the expert axis only splits the batch and the weights, as fsdp does,
over the same devices (expert is the innermost axis, fsdp the next), so ``fsdp=a, expert=b`` and
``fsdp=a·b`` are one candidate: dense models get expert = 1.  Pipeline and context parallelism are
not searched.

**Fixed global batch.** Every candidate trains the same global batch of ``global_batch`` sequences
per optimizer step.  The batch is split over data × fsdp × expert (the tensor axis shares its
sequences), so a candidate runs ``global_batch / (data·fsdp·expert)`` sequences per device: a mesh
with tensor = t runs a t times larger microbatch than tensor = 1.  When that microbatch's plan does
not fit, the candidate accumulates gradients: the smallest number of microsteps k (a divisor of the
microbatch) whose everything-recomputed floor fits beside the float32 accumulator, each microstep
running ``microbatch / k`` sequences; its plan is solved for k microbatches per update
(:func:`tierax.costmodel.evaluate`: the update once, the accumulator in the microbatches' peaks,
which the planner may offload).  Candidates whose batch axes do not divide the global batch are left
out (said).

**Exact per candidate.** Each candidate's placement is solved by the planner
(:func:`tierax.solving.planning.solve`), which is exact for the cost model; candidates are ranked
by tokens per second at the global batch: ``global_batch · seq / step time``.

**Pruning, only where provably safe.**

* *State bound* (no trace needed): parameters, gradients and AdamW moments are in every peak of
  every placement at every microbatch (:class:`tierax.costmodel.FixedTerms`), so a candidate whose
  state alone exceeds the device budget cannot fit with any placement or accumulation.
* *Carry bound* (no trace needed): every layer's input (microbatch × seq × d_model in the compute
  dtype) stays on the device under every placement, so an accumulation whose state plus layer
  inputs exceed the budget is not traced: its floor cannot fit.
* *Time bound*: every placement's step time is at least ``k · (compute_s + exposed_collective_s)``
  of the fixed terms less the update's HBM time of the k − 1 microbatches that do not run it (the
  prediction adds recomputation, exposed transfers, the accumulation and first touch, all ≥ 0), so
  a candidate whose bound is no faster than the N-th best solved candidate cannot enter the top N
  and is not solved.  Candidates are solved in the order of their bound.

**Reuse.** The layer traces depend on the mesh only through the local shape (tensor, microbatch):
:func:`tierax.tracing.inventory.model_inventory` keeps them per local shape, so the candidates of
one tensor size share one trace; the rest of an inventory (parameter shards, collective bytes) is
arithmetic.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tierax import costmodel as cm
from tierax.costmodel import network
from tierax.costmodel.state import ACCUM_ITEMSIZE
from tierax.errors import TieraxError
from tierax.mesh import AXES, MeshShape
from tierax.sizes import size_text
from tierax.solving import planner, planning
from tierax.tracing import hbm, model_program
from tierax.tracing import inventory as inv_lib

OUT_OF_SCOPE = "pipeline and context parallelism are not searched"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def has_experts(cfg) -> bool:
    return bool(getattr(cfg, "num_experts", 0))


def meshes(cfg, devices: int) -> tuple[list[MeshShape], list[tuple[MeshShape, str]]]:
    """(every mesh of ``devices`` the model admits, [(a mesh it does not, why)]); no duplicates."""
    ok, refused = [], []
    for data in divisors(devices):
        for fsdp in divisors(devices // data):
            for tensor in divisors(devices // (data * fsdp)):
                expert = devices // (data * fsdp * tensor)
                if expert > 1 and not has_experts(cfg):
                    continue  # the same devices and sharding as fsdp × expert on fsdp
                shape = MeshShape(data, fsdp, tensor, expert)
                try:
                    shape.check_model(cfg, where="mesh")
                except TieraxError as e:
                    refused.append((shape, str(e)))
                    continue
                ok.append(shape)
    return ok, refused


@dataclass
class Candidate:
    mesh: MeshShape
    microbatch: int  # sequences per device per microstep
    grad_accum: int  # microsteps per optimizer step
    result: planner.PlanResult | None = None  # the planner's plan (None: not solved or no fit)
    lower_bound_s: float = 0.0  # per optimizer step, no placement is faster
    floor_bytes: int = 0  # the smallest peak of any placement (everything recomputed), 1 microstep
    state_bytes: int = 0
    budget_bytes: int = 0
    # open (its floor fits: to solve), solved, pruned (time bound), no fit (no accumulation's
    # floor fits), no fit (state bound), no fit (planner)
    status: str = "open"
    collectives: dict = dataclasses.field(default_factory=dict)  # group → seconds per step
    links: dict = dataclasses.field(default_factory=dict)  # group → AxisLink

    @property
    def floor_fits(self) -> bool:
        """Some placement fits (the everything-recomputed floor does, at its accumulation)."""
        return self.status in ("open", "solved", "pruned (time bound)")

    @property
    def step_time_s(self) -> float | None:
        """Seconds per optimizer step (k microsteps)."""
        # The planner's prediction is the whole step: grad_accum microbatches and one update.
        return None if self.result is None else self.result.predicted.step_time_s

    def tokens_per_s(self, tokens: int) -> float | None:
        return None if self.result is None else tokens / self.step_time_s

    def lacks(self) -> str:
        """What a candidate that does not fit lacks, in bytes over its budget."""
        over = (self.state_bytes if self.status.endswith("state bound)") else self.floor_bytes) - (
            self.budget_bytes
        )
        what = (
            "its parameters, gradients and AdamW state alone"
            if self.status.endswith("state bound)")
            else (
                f"recomputing everything at microbatch {self.microbatch}"
                + (f" × {self.grad_accum} microsteps" if self.grad_accum > 1 else "")
            )
        )
        return f"{what} need at least {size_text(over)} more than the budget"

    def to_json(self, tokens: int) -> dict:
        pred = self.result.predicted if self.result else None
        return {
            "mesh": self.mesh.to_dict(),
            "microbatch": self.microbatch,
            "grad_accum": self.grad_accum,
            "status": self.status,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s(tokens),
            "lower_bound_s": self.lower_bound_s,
            "peak_device_bytes": pred.peak_device_bytes if pred else None,
            "host_bytes": pred.host_bytes if pred else None,
            "floor_bytes": self.floor_bytes,
            "state_bytes": self.state_bytes,
            "budget_bytes": self.budget_bytes,
            "collective_s": self.collectives,
            "exposed_collective_s": (
                self.grad_accum * pred.breakdown.exposed_collective_s if pred else None
            ),
            "links": {k: v.to_json() for k, v in self.links.items() if v.link != "none"},
            "breakdown": pred.breakdown.to_json() if pred else None,
        }


@dataclass
class Search:
    cfg: object
    devices: int
    global_batch: int
    seq: int
    candidates: list[Candidate]  # ranked: solved by tokens/s first, then the rest
    refused: list[tuple[MeshShape, str]]  # meshes the model does not admit, or the batch
    solves: int  # planner runs
    top: int

    @property
    def tokens(self) -> int:
        return self.global_batch * self.seq

    @property
    def ranked(self) -> list[Candidate]:
        return [c for c in self.candidates if c.result is not None]

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None


def _state_bytes(cfg, mesh: MeshShape) -> int:
    import jax.numpy as jnp

    count = inv_lib.per_device_param_count(cfg, mesh.to_dict())
    p = int(count * jnp.dtype(cfg.param_dtype).itemsize)
    # parameters, gradients, AdamW mu and nu (as model_inventory counts them)
    return 2 * p + p * inv_lib.moment_bytes_per_param(cfg) // jnp.dtype(cfg.param_dtype).itemsize


def _accumulator_bytes(cfg, mesh: MeshShape) -> int:
    """The float32 gradient accumulator per device (costmodel.state.accumulator_bytes: 4 bytes a
    parameter, whatever the parameter dtype)."""
    count = inv_lib.per_device_param_count(cfg, mesh.to_dict())
    return int(count * ACCUM_ITEMSIZE)


def layer_input_bytes(cfg, microbatch: int, seq: int) -> int:
    """Every layer's input (the scan carry, [microbatch, seq, d_model] in the compute dtype), on
    the device under every placement: the carry bound's bytes."""
    import jax.numpy as jnp

    layers = sum(g.num_layers for g in cfg.layer_groups())
    return microbatch * seq * cfg.d_model * jnp.dtype(cfg.dtype).itemsize * layers


def _prepare(cfg, mesh, microbatch, seq, rates, schedule, budget) -> Candidate:
    """The candidate's accumulation (the smallest k whose everything-recomputed floor fits); its
    bounds come from :func:`_bound`; nothing solved yet."""
    state = _state_bytes(cfg, mesh)
    cand = Candidate(mesh, microbatch, 1, state_bytes=state, budget_bytes=budget)
    if state > budget:
        cand.status = "no fit (state bound)"
        return cand
    accumulator = _accumulator_bytes(cfg, mesh)
    for k in divisors(microbatch):
        accum_bytes = accumulator if k > 1 else 0  # float32, every parameter's
        carry = layer_input_bytes(cfg, microbatch // k, seq)
        if state + carry > budget - accum_bytes:  # the carry bound: no trace needed
            cand.microbatch, cand.grad_accum = microbatch // k, k
            cand.floor_bytes, cand.budget_bytes = state + carry, budget - accum_bytes
            continue
        prog = model_program.program_of(cfg, microbatch // k, seq, mesh.to_dict())
        everything_remat = {
            (i.group, i.name): planner.Placement.REMAT for i in cm.item_terms(prog.inventory, rates)
        }
        floor = cm.evaluate(everything_remat, prog, rates, schedule).peak_device_bytes
        cand.microbatch, cand.grad_accum = microbatch // k, k
        cand.floor_bytes, cand.budget_bytes = floor, budget - accum_bytes
        if floor <= budget - accum_bytes:
            return cand  # open
    cand.status = "no fit"
    return cand


def _bound(c: Candidate, cfg, seq, rates, schedule) -> Candidate:
    """``c`` (not yet solved) with its time bound, collectives and links under ``rates``."""
    prog = model_program.program_of(cfg, c.microbatch, seq, c.mesh.to_dict())
    inv = prog.inventory
    fx = cm.fixed_terms(prog, rates, schedule)
    k = c.grad_accum
    update_s = hbm.optimizer_bytes(inv.param_bytes) / rates.hbm_bytes_per_s
    return dataclasses.replace(
        c,
        status="open",
        result=None,
        lower_bound_s=k * (fx.compute_s + fx.exposed_collective_s) - (k - 1) * update_s,
        collectives={g: k * s for g, s in cm.collective_s_by_group(prog, rates).items()},
        links=network.axis_links(inv.mesh, rates),
    )


def search(
    cfg,
    devices: int,
    rates,
    *,
    global_batch: int,
    seq: int,
    schedule: str = "lhs",
    budget_bytes: float | None = None,
    host_budget_bytes: float | None = None,
    top: int = 5,
    prune: bool = True,
    prepared: list[Candidate] | None = None,
) -> Search:
    """Rank every admitted mesh of ``devices`` by tokens/s at ``global_batch`` × ``seq`` (see the
    module docstring).  ``top``: the N the time bound keeps exact; ``prune=False`` solves every
    candidate (the bound's check).

    Raises:
      TieraxError: no mesh admitted (the reasons listed).
    """
    if schedule not in cm.SCHEDULES:
        raise TieraxError(
            f"unknown schedule {schedule!r}; choose one of: {', '.join(cm.SCHEDULES)}"
        )
    budget, host_budget = planner.budgets(rates, budget_bytes, host_budget_bytes)
    admitted, refused = meshes(cfg, devices)
    if not admitted:
        raise TieraxError(
            f"no mesh of {devices} devices fits {cfg.name}'s dimensions: "
            + "; ".join(r for _, r in refused[:3])
        )
    if prepared is None:
        prepared = []
        for m in admitted:
            if global_batch % m.batch_ways:
                refused.append(
                    (
                        m,
                        f"global batch {global_batch} is not divisible by data×fsdp×expert = "
                        f"{m.batch_ways}",
                    )
                )
                continue
            prepared.append(
                _prepare(cfg, m, global_batch // m.batch_ways, seq, rates, schedule, budget)
            )
        if not prepared:
            raise TieraxError(_indivisible(cfg, devices, global_batch, admitted, refused))
    else:  # a what-if on link rates: the floors and accumulations do not depend on them
        kept = {c.mesh for c in prepared}
        refused = [(m, "left out by the search this re-ranks") for m in admitted if m not in kept]
    prepared = [
        _bound(c, cfg, seq, rates, schedule) if c.floor_fits else dataclasses.replace(c)
        for c in prepared
    ]
    open_ = sorted(
        (c for c in prepared if c.floor_fits), key=lambda c: (c.lower_bound_s, str(c.mesh))
    )
    times: list[float] = []
    solves = 0
    for c in open_:
        if prune and len(times) >= top and c.lower_bound_s >= sorted(times)[top - 1]:
            c.status = "pruned (time bound)"
            continue
        req = planning.Request(
            cfg,
            c.mesh.to_dict(),
            rates,
            microbatch=c.microbatch,
            seq=seq,
            schedule=schedule,
            # The device budget itself: with grad_accum the planner counts the accumulator (and
            # may offload it); c.budget_bytes, less the accumulator, is the floor's bound only.
            budget_bytes=budget,
            host_budget_bytes=host_budget,
            name=f"planned-{_mesh_name(c.mesh)}",
            grad_accum=c.grad_accum,
        )
        solves += 1
        try:
            c.result, _ = planning.solve(req)
        except planner.NoPlanFits:
            c.status = "no fit (planner)"
            continue
        c.status = "solved"
        times.append(c.step_time_s)
    tokens = global_batch * seq
    solved = sorted(
        (c for c in prepared if c.result is not None),
        # ties (tiny models): less collective time, then the mesh's text
        key=lambda c: (-c.tokens_per_s(tokens), sum(c.collectives.values()), str(c.mesh)),
    )
    rest = sorted(
        (c for c in prepared if c.result is None),
        key=lambda c: (c.status, c.floor_bytes - c.budget_bytes, str(c.mesh)),
    )
    return Search(cfg, devices, global_batch, seq, solved + rest, refused, solves, top)


def _indivisible(cfg, devices: int, global_batch: int, admitted, refused) -> str:
    """Why no admitted mesh can train ``global_batch``: each splits the batch a number of ways
    (data × fsdp × expert) that does not divide it; the message names the ways and the fix."""
    ways = sorted({m.batch_ways for m in admitted})
    single = [r for m, r in refused if m.batch_ways == 1 and not r.startswith("global batch")]
    text = (
        f"global batch {global_batch} is not divisible by data×fsdp×expert of any mesh of "
        f"{devices} devices {cfg.name} admits (they split the batch {', '.join(map(str, ways))} "
        f"ways)"
    )
    if single:
        text += f"; the mesh that would not split it is refused: {single[0]}"
    return text + f". Use a --global-batch that is a multiple of {ways[0]}, or other --devices"


def _mesh_name(m: MeshShape) -> str:
    return "-".join(f"{a}{getattr(m, a)}" for a in AXES if getattr(m, a) > 1) or "single"


def closest(s: Search, n: int = 3) -> list[Candidate]:
    """The candidates nearest to fitting (least over their budget)."""
    misses = [c for c in s.candidates if c.result is None and not c.status.startswith("pruned")]
    return sorted(
        misses,
        key=lambda c: (
            (c.state_bytes if c.status.endswith("state bound)") else c.floor_bytes) - c.budget_bytes
        ),
    )[:n]


def why_best(s: Search) -> str:
    """One sentence: what the winner saves against the runner-up, term by term."""
    r = s.ranked
    if not r:
        return ""
    a = r[0]
    if len(r) == 1:
        return f"{a.mesh} is the only candidate that fits"
    b = r[1]
    pa, pb = a.result.predicted.breakdown, b.result.predicted.breakdown
    terms = {
        "compute": (a.grad_accum * pa.compute_s, b.grad_accum * pb.compute_s),
        "recomputation": (a.grad_accum * pa.recompute_s, b.grad_accum * pb.recompute_s),
        "exposed transfers": (
            a.grad_accum * (pa.exposed_d2h_s + pa.exposed_h2d_s),
            b.grad_accum * (pb.exposed_d2h_s + pb.exposed_h2d_s),
        ),
        "exposed collectives": (
            a.grad_accum * pa.exposed_collective_s,
            b.grad_accum * pb.exposed_collective_s,
        ),
    }
    if b.step_time_s <= a.step_time_s * (1 + 1e-9):
        return (
            f"{a.mesh} ties with {b.mesh} (predicted step {a.step_time_s:.4g} s); it spends "
            f"{sum(a.collectives.values()):.3g} s in collectives vs "
            f"{sum(b.collectives.values()):.3g}"
        )
    diffs = sorted(((y - x, k, x, y) for k, (x, y) in terms.items()), reverse=True)
    parts = [f"{k} {x:.3g} s vs {y:.3g} s" for d, k, x, y in diffs if abs(d) > 1e-9][:2]
    crossing = [g for g, link in b.links.items() if link.crosses_domain and g in b.collectives]
    note = (
        f"; the runner-up's {', '.join(crossing)} collectives cross NVLink domains"
        if crossing and not any(a.links[g].crosses_domain for g in a.links if g in a.collectives)
        else ""
    )
    return (
        f"{a.mesh} beats {b.mesh} by {(b.step_time_s / a.step_time_s - 1) * 100:.1f} % per step: "
        + ", ".join(parts)
        + note
    )


SENSITIVITY = (
    ("scale_out", 0.5),
    ("scale_out", 2.0),
    ("interconnect", 0.5),
    ("interconnect", 2.0),
)
RATE_FIELDS = {"scale_out": "scale_out_bytes_per_s", "interconnect": "interconnect_bytes_per_s"}


def sensitivity(s: Search, rates, **kwargs) -> list[dict]:
    """The search again with the scale-out and NVLink rates halved and doubled: each variant's
    winner and where the baseline's top candidates rank."""
    out = []
    base = [c.mesh for c in s.ranked[: s.top]]
    prepared = list(s.candidates)
    for key, factor in SENSITIVITY:
        gbps = getattr(rates, RATE_FIELDS[key]) * factor / 1e9
        if gbps <= 0:
            continue
        r = cm.override_rates(rates, [f"{key}={gbps:g}"])
        v = search(
            s.cfg,
            s.devices,
            r,
            global_batch=s.global_batch,
            seq=s.seq,
            top=s.top,
            prepared=prepared,
            **kwargs,
        )
        order = [c.mesh for c in v.ranked]
        out.append(
            {
                "rate": key,
                "factor": factor,
                "bytes_per_s": gbps * 1e9,
                "winner": v.best.mesh.to_dict() if v.best else None,
                "winner_tokens_per_s": v.best.tokens_per_s(v.tokens) if v.best else None,
                "baseline_ranks": [(order.index(m) + 1) if m in order else None for m in base],
                "same_winner": bool(v.best and base and v.best.mesh == base[0]),
            }
        )
    return out


class NoMeshFits(TieraxError):
    """No candidate mesh fits the budgets (the message lists the closest and what each lacks)."""


def check_fits(s: Search) -> None:
    """Raise :class:`NoMeshFits` when no candidate has a plan.

    Raises:
      NoMeshFits: listing the closest candidates and what each lacks.
    """
    if s.best is not None:
        return
    near = closest(s)
    lines = [
        f"no mesh of {s.devices} devices fits {s.cfg.name} at global batch {s.global_batch} × seq "
        f"{s.seq} within the device budget ({len(s.candidates)} candidates, "
        f"{len(s.refused)} meshes left out)" + ("; the closest:" if near else "")
    ]
    for c in near:
        lines.append(f"  {c.mesh}: {c.lacks()}")
    lines.append("Use a smaller --global-batch or --seq, more --devices, or a larger --budget-gib")
    raise NoMeshFits("\n".join(lines))


def to_json(s: Search, sensitivity_rows: list[dict], wall_s: float) -> dict:
    """The search as a record's body (candidates ranked, the winner first)."""
    tokens = s.tokens
    return {
        "model": s.cfg.name,
        "devices": s.devices,
        "global_batch": s.global_batch,
        "seq": s.seq,
        "tokens_per_step": tokens,
        "top": s.top,
        "search_wall_s": wall_s,
        "planner_solves": s.solves,
        "candidates_admitted": len(s.candidates),
        "pruned_by_time_bound": sum(c.status == "pruned (time bound)" for c in s.candidates),
        "no_fit_by_state_bound": sum(c.status == "no fit (state bound)" for c in s.candidates),
        "refused": [{"mesh": m.to_dict(), "why": why} for m, why in s.refused],
        "winner": s.best.mesh.to_dict() if s.best else None,
        "why": why_best(s),
        "candidates": [c.to_json(tokens) for c in s.candidates],
        "sensitivity": sensitivity_rows,
        "out_of_scope": OUT_OF_SCOPE,
    }
