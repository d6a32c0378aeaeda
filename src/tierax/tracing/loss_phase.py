"""What a traced training step holds outside its layer scans and in a routed-expert layer's
backward, read from the jaxpr of its value and gradient (:func:`read`, :func:`moe_backward`): the
Python API's front end (:func:`tierax.api.inventory`) fills a
:class:`~tierax.tracing.program.Program`'s loss-phase and MoE terms from them, as tierax's own
front end (:mod:`tierax.tracing.model_program`) fills them from a model config.

**The loss phase** is the program between the last forward layer scan and the first backward one
in ``jax.value_and_grad(loss_fn)``'s jaxpr: the scans the loss's value is computed from there are
``loss_fn``'s own scans its value is computed from, in the same order, and the layer scans among
them (:func:`tierax.api.inventory`'s: a checkpointed layer applied to the carry) are the forward
layer scans; the backward begins at the first equation outside the loss's ancestors that reads a
forward layer scan's residual (an output the loss does not read).  Its bytes are
:mod:`tierax.tracing.liveness`'s reading (XLA:GPU's fusion assumed), at the equation where the
most are live (the gradients written by then included), split as the cost model prices them:

* the state (the parameters and the batch, the step's arguments) and the layer scans' residuals
  (the kept activations, which the plan places) are not counted;
* the gradients written by then (the step's returned gradients live there, e.g. the head's) are
  state: :attr:`LossPhase.unwritten_params` counts the parameters whose gradients are not yet
  written there (the cost model's loss phase leaves those out of the state);
* everything else live there is :attr:`LossPhase.held_bytes`: the logits and their gradient, the
  head's operands and its gradient's matmul output, a loss scan's working set (a loss computed
  over token tiles: one tile's).

**The head** (:class:`~tierax.tracing.program.Head`) is the loss phase's forward matmul with a
two-dimensional parameter ``[hidden, vocab]`` (a cast or transpose of it) as an operand, the one
with the largest output where there are several; inside a scan of the loss phase (a loss over
token tiles) its tiles are the scan's length.  Its tokens are its FLOPs over ``2·hidden·vocab``.

**A routed-expert layer**: in a layer that routes (its forward chooses with a ``top_k``, an
``approx_top_k`` or an ``argmax``), a layer parameter that a batched matmul (a ``dot_general``
batched over that operand's leading dimension) or a grouped matmul (``ragged_dot``) reads is an
expert weight (per-head weights batched over heads, in a layer that does not route, are not); a
layer with any is a MoE layer, whose backward's own buffers (every buffer its backward writes,
its residuals, the gradients of its parameters and its input left out; the largest live at once)
are :func:`moe_backward`'s bytes — what :func:`tierax.models.moe.backward_buffer_bytes` prices
for tierax's own MoE from its shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
from jax.extend.core import Literal

from tierax.errors import TieraxError
from tierax.tracing import liveness
from tierax.tracing.program import Head

# The choices a router makes (a layer with one of them routes).
ROUTING = frozenset({"top_k", "approx_top_k", "argmax"})


@dataclass(frozen=True)
class LossPhase:
    """The loss phase of a traced step (module docstring), per device as traced."""

    held_bytes: int  # besides the state, the kept activations and the gradients written by then
    unwritten_params: int  # parameters whose gradients are not yet written at the phase's peak
    head: Head | None
    head_tokens: int  # tokens the head computes logits for (all tiles)
    logits_bytes: int  # the head's output, one tile
    # the buffers held at the peak outside loops (their shapes), and a loop's working set there
    # (a loss over token tiles: one tile's, its body's largest live bytes)
    held: tuple[str, ...] = ()
    loop_bytes: int = 0


def _has(collection, v) -> bool:
    """``v in collection`` for a jaxpr operand (a literal is in none)."""
    return not isinstance(v, Literal) and v in collection


def _ancestors(nodes, var) -> set[int]:
    """Indices of the nodes ``var`` is computed from."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.outvars}
    out, todo = set(), [var]
    while todo:
        v = todo.pop()
        i = producer.get(v) if not isinstance(v, Literal) else None
        if i is None or i in out:
            continue
        out.add(i)
        todo.extend(nodes[i].invars)
    return out


def _param_origins(nodes, params: dict) -> dict:
    """Each value made from one parameter by fusible one-input operations (a cast, transpose,
    reshape): value → that parameter."""
    origin = dict(params)
    for n in nodes:
        if n.kernel:
            continue
        ins = [v for v in n.invars if not isinstance(v, Literal)]
        if len(ins) == 1 and ins[0] in origin:
            for o in n.outvars:
                origin[o] = origin[ins[0]]
    return origin


def _head_candidates(nodes, origin: dict, tiles: int):
    """(output bytes, Head, tokens) of every matmul in ``nodes`` with a 2-D parameter operand;
    a scan's body is searched with its constants mapped to the scan's operands."""
    out = []
    for n in nodes:
        if n.primitive == "dot_general":
            (lc, rc), (lb, rb) = n.eqn.params["dimension_numbers"]
            for v, contract, batch in ((n.invars[0], lc, lb), (n.invars[1], rc, rb)):
                p = origin.get(v) if not isinstance(v, Literal) else None
                if p is None or len(p.aval.shape) != 2 or batch or len(contract) != 1:
                    continue
                hidden = v.aval.shape[contract[0]]
                vocab = math.prod(p.aval.shape) // hidden
                flops = 2 * math.prod(n.outvars[0].aval.shape) * hidden
                tokens = tiles * flops // (2 * hidden * vocab)
                nb = liveness.nbytes(n.outvars[0].aval)
                out.append((nb, Head(hidden, vocab, tiles), tokens))
        elif n.primitive == "scan" and n.inner:
            body = n.inner[0]
            consts = n.eqn.params.get("num_consts")
            if consts is None:
                consts = len(n.eqn.params["ft_in"].unpack()[0])
            inner_params = {
                bv: origin[ov]
                for bv, ov in zip(body.invars[:consts], n.invars[:consts], strict=True)
                if not isinstance(ov, Literal) and ov in origin
            }
            inner = liveness.flatten(body)
            out += _head_candidates(
                inner,
                _param_origins(inner, inner_params),
                tiles * int(n.eqn.params["length"]),
            )
    return out


def read(loss_fn, params, batch, closed, layer_scans: set[int]) -> LossPhase:
    """The loss phase of ``jax.value_and_grad(loss_fn)`` at ``params``/``batch`` (pytrees of
    ShapeDtypeStructs) (module docstring): ``closed`` is ``loss_fn``'s own jaxpr, ``layer_scans``
    the ids of its layer scans' equations.

    Raises:
      TieraxError: the gradient's jaxpr does not run loss_fn's scans as its forward, or reads no
        residual of its layer scans (a program this reading does not know).
    """
    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss_fn))(params, batch).jaxpr
    nodes = liveness.flatten(jaxpr)
    n_params = len(jax.tree.leaves(params))
    param_vars = jaxpr.invars[:n_params]
    loss, grads = jaxpr.outvars[0], jaxpr.outvars[1:]
    forward = _ancestors(nodes, loss)
    # The forward scans of the gradient are loss_fn's scans the loss is computed from, in order.
    own = liveness.flatten(closed)
    live = _ancestors(own, closed.jaxpr.outvars[0])
    is_layer = [
        id(n.eqn) in layer_scans for i, n in enumerate(own) if n.primitive == "scan" and i in live
    ]
    fwd_scans = [i for i in sorted(forward) if nodes[i].primitive == "scan"]
    if len(fwd_scans) != len(is_layer) or not any(is_layer):
        raise TieraxError(
            f"the gradient of loss_fn runs {len(fwd_scans)} forward scans where loss_fn runs "
            f"{len(is_layer)}; tierax.inventory cannot tell its loss phase (run each layer "
            "group as one lax.scan over a jax.checkpoint'ed layer)"
        )
    fwd_layers = [i for i, layer in zip(fwd_scans, is_layer, strict=True) if layer]
    read_forward = {v for i in forward for v in nodes[i].invars if not isinstance(v, Literal)}
    residuals = {
        o for i in fwd_layers for o in nodes[i].outvars if o not in read_forward and o is not loss
    }
    begin = max(fwd_layers)
    end = next(
        (
            i
            for i in range(begin + 1, len(nodes))
            if i not in forward and any(_has(residuals, v) for v in nodes[i].invars)
        ),
        None,
    )
    if end is None:
        raise TieraxError(
            "the gradient of loss_fn reads none of its layer scans' residuals: no backward layer "
            "scan to plan (is the loss a function of the layers' output?)"
        )
    bufs = liveness.buffers(nodes, jaxpr.invars, jaxpr.outvars)
    grad_set = {g for g in grads if not isinstance(g, Literal)}
    state = set(jaxpr.invars) | residuals

    def other(b):
        return b not in state and b not in grad_set

    best, at = (-1, 0), begin + 1  # (held, written gradients) where their sum is largest
    for i in range(begin + 1, end):
        n = nodes[i]
        if not (n.writes or any(o in bufs.sizes for o in n.outvars)):
            continue
        held = bufs.live_at(i, other) + liveness.inner_peak(n)
        written = bufs.live_at(i, lambda b: b in grad_set)
        if held + written > sum(best):
            best, at = (held, written), i
    unwritten = sum(
        math.prod(g.aval.shape) for g in grad_set if g in bufs.start and bufs.start[g] > at
    )
    origin = _param_origins(nodes, {v: v for v in param_vars})
    loss_nodes = [nodes[i] for i in range(begin + 1, end) if i in forward]
    heads = _head_candidates(loss_nodes, origin, 1)
    head, tokens, logits = None, 0, 0
    if heads:
        logits, head, tokens = max(heads, key=lambda h: h[0])
    held = tuple(sorted((b.aval.str_short() for b in bufs.live(at, other)), key=str))
    return LossPhase(
        int(best[0]),
        int(unwritten),
        head,
        int(tokens),
        int(logits),
        held,
        int(liveness.inner_peak(nodes[at])),
    )


def expert_params(layer_fn, x, params) -> int:
    """Elements of ``params`` (one layer's, a sequence of ShapeDtypeStructs) that a batched or
    grouped matmul of a routing layer reads as a weight (module docstring): the layer's routed
    experts."""
    jaxpr = jax.make_jaxpr(layer_fn)(x, params).jaxpr
    nodes = liveness.flatten(jaxpr)
    if not any(n.primitive in ROUTING for n in nodes):
        return 0
    leaves = jaxpr.invars[1:]
    origin = _param_origins(nodes, {v: v for v in leaves})
    experts = set()
    for n in nodes:
        if n.primitive == "dot_general":
            _, (lb, rb) = n.eqn.params["dimension_numbers"]
            for v, batch in ((n.invars[0], lb), (n.invars[1], rb)):
                if 0 in batch and _has(origin, v):
                    experts.add(origin[v])
        elif n.primitive in ("ragged_dot", "ragged_dot_general") and _has(origin, n.invars[1]):
            experts.add(origin[n.invars[1]])
    return sum(math.prod(v.aval.shape) for v in experts)


def moe_backward(layer_fn, x, params) -> int:
    """The largest bytes ``layer_fn``'s backward holds besides its residuals, the gradients of its
    parameters and of its input (module docstring)."""

    def fwd_bwd(a, p, ct):
        y, vjp = jax.vjp(layer_fn, a, p)
        return (y, *vjp(ct))

    closed = jax.make_jaxpr(fwd_bwd)(x, params, x)
    jaxpr = closed.jaxpr
    nodes = liveness.flatten(jaxpr)
    forward = _ancestors(nodes, jaxpr.outvars[0])
    bufs = liveness.buffers(nodes, jaxpr.invars, jaxpr.outvars)
    returned = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    backward = {b for b, s in bufs.start.items() if s >= 0 and s not in forward}

    def own(b):
        return b in backward and b not in returned

    return max(
        (
            bufs.live_at(i, own) + liveness.inner_peak(n)
            for i, n in enumerate(nodes)
            if i not in forward
        ),
        default=0,
    )
