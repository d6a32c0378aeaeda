"""Device bytes a traced program holds, read from its jaxpr the way XLA:GPU fuses it: which values
become buffers and how long each lives.

The rule (:func:`flatten`, :func:`buffers`, :func:`body_peak`) assumes XLA's fusion, not an
op-by-op execution (the operation classes are :mod:`tierax.tracing.hbm`'s):

* A **kernel** writes a buffer and reads its operands from buffers: a matmul (``dot_general``, a
  grouped ``ragged_dot``, a convolution), a loop (``scan``, ``while``, ``cond``), a collective, a
  custom call.  Its outputs and its operands are buffers.
* A **fusion root** writes a buffer but fuses the work that makes its operands: a reduction, a
  cumulative op, a sort or top-k, a scatter (XLA:GPU fuses its zero-filled operand and its
  updates), a ``dynamic_update_slice``.
* Everything else (elementwise ops, broadcasts, converts, reshapes, transposes, slices, gathers)
  fuses into its consumers: it is no buffer of its own unless a kernel reads it or the program
  returns it, and each consumer re-reads the buffers it was made from (a value several consumers
  read is recomputed in each, not written once).  Calls (``jit``, ``remat``, ``custom_jvp`` /
  ``custom_vjp``) are inlined.
* A buffer lives from the equation that writes it to the last equation that reads it (directly or
  through the fused values made from it); while an equation runs, its operands and its outputs are
  all live.  A loop's own working set (its body's largest live bytes, read the same way, its
  inputs and carried state left out) is added while the loop runs; a loop's carried output takes
  its input's buffer where the loop is that input's last reader (XLA's while loop updates its
  state in place).

XLA can decide otherwise (a fusion it declines, a layout copy, buffers shared by its heap), so the
figures are XLA's program as this rule reads it; tests/test_api_program.py sets them beside
XLA:GPU's deviceless compile of a step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from jax.extend.core import Literal

from tierax.tracing import hbm, jaxpr_tools

# Equations that call a jaxpr once (inlined: their bodies are read as part of the caller); the
# operation classes are tierax.tracing.hbm's fusion model's.
_CALLS = hbm.INLINE - {"shard_map"}
_LOOPS = frozenset({"scan", "while", "cond"})
_KERNELS = _LOOPS | hbm.MATMUL | hbm.COLLECTIVE | {"custom_call", "fft", "shard_map"}
_ROOTS = hbm.ROOTS | frozenset(hbm.IN_PLACE)


def nbytes(aval) -> int:
    return math.prod(aval.shape) * aval.dtype.itemsize if hasattr(aval, "shape") else 0


@dataclass(eq=False)
class Node:
    """One equation of a flattened jaxpr: its primitive, inputs and outputs (the caller's
    variables, call bodies inlined) and the jaxpr equation it came from."""

    primitive: str
    invars: list
    outvars: list
    eqn: object
    inner: tuple = field(default=())  # the body jaxprs of a loop

    @property
    def kernel(self) -> bool:
        return self.primitive in _KERNELS

    @property
    def writes(self) -> bool:
        return self.primitive in _KERNELS or self.primitive in _ROOTS


def _sub_jaxpr(eqn):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(key)
        if sub is not None:
            return sub
    return None


def flatten(jaxpr) -> list[Node]:
    """``jaxpr``'s equations with every call (``jit``, ``remat``, ``custom_jvp``/``custom_vjp``
    calls) inlined, as :class:`Node` over the caller's variables."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    out: list[Node] = []
    _flatten_into(jaxpr, {}, out)
    return out


def _flatten_into(jaxpr, env: dict, out: list[Node]) -> None:
    def read(v):
        return v if isinstance(v, Literal) else env.get(v, v)

    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        sub = _sub_jaxpr(eqn) if eqn.primitive.name in _CALLS else None
        if sub is not None:
            inner = getattr(sub, "jaxpr", sub)
            if len(inner.invars) == len(ins) and len(inner.outvars) == len(eqn.outvars):
                env2 = dict(zip(inner.invars, ins, strict=True))
                _flatten_into(inner, env2, out)
                for o, io in zip(eqn.outvars, inner.outvars, strict=True):
                    env[o] = io if isinstance(io, Literal) else env2.get(io, io)
                continue
        bodies = tuple(getattr(j, "jaxpr", j) for j in _loop_bodies(eqn))
        out.append(Node(eqn.primitive.name, ins, list(eqn.outvars), eqn, bodies))


def _loop_bodies(eqn) -> list:
    name = eqn.primitive.name
    if name == "scan":
        return [eqn.params["jaxpr"]]
    if name == "while":
        return [eqn.params["body_jaxpr"], eqn.params["cond_jaxpr"]]
    if name == "cond":
        return list(eqn.params["branches"])
    return []


def _is_var(v) -> bool:
    return not isinstance(v, Literal) and type(v).__name__ != "DropVar"


@dataclass
class Buffers:
    """The buffers of a flattened program: each written at ``start[b]`` (−1: an input) and last
    read at ``end[b]`` (``len(nodes)``: returned)."""

    nodes: list[Node]
    start: dict
    end: dict
    sizes: dict

    def live_at(self, i: int, keep: Callable[[object], bool] = lambda b: True) -> int:
        """Bytes of the buffers ``keep`` accepts live while node ``i`` runs."""
        return sum(
            s for b, s in self.sizes.items() if self.start[b] <= i <= self.end[b] and keep(b)
        )

    def live(self, i: int, keep: Callable[[object], bool] = lambda b: True) -> list:
        """The buffers ``keep`` accepts live while node ``i`` runs (those of no bytes left out:
        a loop's state input, whose buffer its output took)."""
        return [
            b for b, s in self.sizes.items() if s and self.start[b] <= i <= self.end[b] and keep(b)
        ]


def buffers(nodes: Sequence[Node], invars: Sequence, outvars: Sequence) -> Buffers:
    """Which values of ``nodes`` are buffers and when each lives (the module docstring's rule)."""
    needed = {v for n in nodes if n.kernel for v in n.invars if _is_var(v)}
    needed |= {v for v in outvars if _is_var(v)}
    start: dict = {v: -1 for v in invars if _is_var(v)}
    sources: dict = {v: frozenset([v]) for v in start}
    end: dict = {v: -1 for v in start}
    for i, n in enumerate(nodes):
        read = frozenset().union(*(sources.get(v, ()) for v in n.invars if _is_var(v)))
        outs = [o for o in n.outvars if _is_var(o)]
        written = n.writes or any(o in needed for o in outs)
        for o in outs:
            if written:
                start[o], end[o], sources[o] = i, i, frozenset([o])
            else:
                sources[o] = read
        if written:
            for b in read:
                end[b] = max(end[b], i)
    for v in outvars:
        for b in sources.get(v, ()) if _is_var(v) else ():
            end[b] = len(nodes)
    sizes = {b: nbytes(b.aval) for b in start}
    # A loop updates its state in place: a carry's output takes the buffer of its input where the
    # loop is that input's last reader (XLA's while loop aliases them).
    for i, n in enumerate(nodes):
        for a, b in _carries(n):
            if a in sizes and start[a] >= 0 and end[a] == i and sizes[a] == sizes.get(b):
                start[b], sizes[a] = start[a], 0
    return Buffers(list(nodes), start, end, sizes)


def _carries(node: Node) -> list:
    """(input, output) of each loop-carried value of a ``scan`` node."""
    if node.primitive != "scan":
        return []
    consts, carries = jaxpr_tools.scan_split(node.eqn.params)
    ins = node.invars[consts : consts + carries]
    return [(a, b) for a, b in zip(ins, node.outvars[:carries], strict=True) if _is_var(a)]


def body_peak(jaxpr, state: int = 0) -> int:
    """The largest bytes a loop body holds besides its inputs and its first ``state`` outputs
    (the loop's carried state, updated in place: the loop's own buffers), one iteration, nested
    loops' bodies included."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    nodes = flatten(jaxpr)
    bufs = buffers(nodes, jaxpr.invars, jaxpr.outvars)
    skip = {v for v in list(jaxpr.invars) + list(jaxpr.outvars[:state]) if _is_var(v)}
    return max(
        (
            bufs.live_at(i, lambda b: b not in skip) + inner_peak(n)
            for i, n in enumerate(nodes)
            if n.writes or any(o in bufs.sizes for o in n.outvars if _is_var(o))
        ),
        default=0,
    )


def inner_peak(node: Node) -> int:
    """What a loop node adds while it runs: its largest body's working set."""
    state = jaxpr_tools.scan_split(node.eqn.params)[1] if node.primitive == "scan" else 0
    return max((body_peak(b, state) for b in node.inner), default=0)
