"""HBM traffic of the work that is not a matmul: norms, RoPE, softmax, SwiGLU, residual adds, MoE
routing, casts, the loss's exp, the optimizer update.  On a GPU that work runs at HBM bandwidth.

**Fusion model** (what :func:`phase_bytes` counts on a traced jaxpr). Nested calls (``jit``,
``custom_jvp_call``, ``custom_vjp_call``, ``checkpoint``) are inlined; a ``scan`` body is counted
once per trip, its inputs and outputs crossing HBM. Every other non-matmul operation belongs to a
*fusion*: operations joined by a value one produces and the other consumes (through reshapes,
broadcasts and squeezes, which cost nothing; a transpose is an operation like the others: free
inside a fusion, a copy between two matmuls) form one fusion, as XLA fuses elementwise chains. A
reduction (or sort, scatter) ends its fusion: its result is written, and each consumer fusion reads
it and repeats the elementwise producers it needs, re-reading their inputs (XLA duplicates cheap
producers into each consumer fusion: a softmax reads its scores three times). A fusion reads each
value it takes from outside once — a matmul's output, a layer input or parameter, a scan's slice —
and writes each value it produces that leaves it: a matmul's operand, a collective's operand, a
``checkpoint_name``'d value, an output of the traced function. A dynamic slice or gather reads only
as many bytes of the sliced operand as it returns; a dynamic update or scatter updates its buffer in
place (reads and writes only the update). Matmuls and collectives are boundaries; their own traffic
is not counted here (a matmul's time is its FLOPs at the matmul rate). A value made in one *phase*
(forward, or the backward/tangent part after :func:`marker`) and used in the other is a residual:
written in one, read in the other. Not modelled: XLA's sibling multi-output fusions (two fusions
reading one value read it twice here), layout copies XLA inserts around matmuls (transposes of
float32 attention blocks), XLA's own rematerialisation under memory pressure, and values it hoists
out of loops and reads every trip (bench/hbm_time.py measures what these cost against XLA's
fusions).  What runs inside a fused kernel's stand-in (the ``FUSED_SCOPE`` name scope of
``cudnn_blockwise`` attention) is one boundary, like a matmul: the kernel's own traffic is in its
rate (the cost model's fused-attention term), and what it reads and writes is counted at the fusions
around it.

Of a ``jax.lax.platform_dependent`` choice only the CUDA branch is read, inlined (XLA:GPU's
program holds it alone; tierax.tracing.jaxpr_tools.platform_branch): MXFP8's block-scale
quantization is counted, the CPU emulation's dequantization is not, and the block-scaled GEMM is a
matmul boundary.

Seconds = bytes / the target's HBM bandwidth, added to matmul seconds, not overlapped: on one GPU
stream a fusion and a GEMM run one after the other.

**Sharded weights.** A layer is traced with whole weights, but a device holds a shard of each (FSDP,
expert parallelism) and XLA runs the weights' own elementwise work on the shard: it casts the
float32 shard to the compute dtype before gathering it, and casts a gradient after
reduce-scattering it; an expert-parallel device casts only its own experts.  So with
``weight_ways`` (a weight's shape in the trace → the ways it is split on the mesh) a value of a
weight's shape, or of that shape with its last two axes swapped, moves that share of its bytes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.extend.core import Literal, jaxprs_in_params

from tierax.models.attention import FUSED_SCOPE
from tierax.tracing import jaxpr_tools

MATMUL = frozenset(
    {
        "dot_general",
        "conv_general_dilated",
        "ragged_dot",
        "ragged_dot_general",
        *jaxpr_tools.BLOCK_SCALED_DOTS,
    }
)
COLLECTIVE = frozenset(
    {
        "all_to_all",
        "psum",
        "all_gather",
        "reduce_scatter",
        "psum_scatter",
        "ppermute",
        "pmax",
        "pmin",
        "all_reduce",
        "psum_invariant",
    }
)
FREE = frozenset(
    {
        "reshape",
        "broadcast_in_dim",
        "squeeze",
        "expand_dims",
        "name",
        "sharding_constraint",
        "copy_p",
        "pvary",
        "optimization_barrier",
    }
)
# Operations that end a fusion (their result is written and read by the next one): reductions,
# sorts, scatters.
ROOTS = frozenset(
    {
        "reduce_sum",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "reduce_and",
        "reduce_or",
        "reduce_xor",
        "argmax",
        "argmin",
        "cumsum",
        "cumprod",
        "cummax",
        "cummin",
        "cumlogsumexp",
        "sort",
        "top_k",
        "scatter",
        "scatter-add",
        "scatter_add",
        "scatter_mul",
        "scatter_min",
        "scatter_max",
    }
)
# Operand 0 read only where sliced (bytes of the result), or updated in place (not read; the update
# is written).
SLICING = frozenset({"dynamic_slice", "gather"})
IN_PLACE = {
    "dynamic_update_slice": 1,
    "scatter": 2,
    "scatter-add": 2,
    "scatter_add": 2,
    "scatter_mul": 2,
    "scatter_min": 2,
    "scatter_max": 2,
}  # primitive → position of the update operand
INLINE = frozenset(
    {
        "pjit",
        "jit",
        "closed_call",
        "core_call",
        "custom_jvp_call",
        "custom_vjp_call",
        "custom_vjp_call_jaxpr",
        "checkpoint",
        "remat2",
        "remat",
        "shard_map",
        "custom_lin",
    }
)


def marker(tree):
    """Call between the forward and the backward (or tangent) part of a traced function: it marks
    where the second phase starts (an ``optimization_barrier`` on the cotangents; no FLOPs)."""
    return jax.lax.optimization_barrier(tree)


def _with_transposes(weight_ways: dict) -> dict:
    """``weight_ways`` with each shape's last two axes also swapped (a weight's transpose in the
    backward; where two weights' shapes meet, the smaller split counts)."""
    out = dict(weight_ways)
    for shape, ways in weight_ways.items():
        if len(shape) >= 2:
            t = (*shape[:-2], shape[-1], shape[-2])
            out[t] = min(out.get(t, ways), ways)
    return out


class _Flat:
    """A jaxpr flattened into (primitive, input ids, output ids, multiplier, phase) records."""

    def __init__(self, weight_ways: dict | None = None):
        self.weight_ways = weight_ways or {}
        self.nbytes: list[float] = []
        self.eqns: list[tuple[str, list, list, int, int]] = []
        self.outputs: set[int] = (
            set()
        )  # values a traced function or a scan body returns (they cross HBM)
        self.avals: list = []
        self.params: dict[int, dict] = {}  # eqn index → its params (dot_general and name only)

    def new(self, aval) -> int:
        shape = tuple(getattr(aval, "shape", ()))
        nbytes = math.prod(shape) * getattr(getattr(aval, "dtype", None), "itemsize", 0)
        self.nbytes.append(nbytes / self.weight_ways.get(shape, 1))  # a weight: its shard's
        self.avals.append(aval)
        return len(self.nbytes) - 1

    def walk(self, jaxpr, env: dict, mult: int, phase: int, top: bool = False) -> int:
        def read(v):
            return None if isinstance(v, Literal) else env.get(v)

        platforms = jaxpr_tools.platform_indices(jaxpr)
        for eqn in jaxpr.eqns:
            prim = eqn.primitive.name
            if top and prim == "optimization_barrier" and phase == 0:
                phase = 1
            subs = list(jaxprs_in_params(eqn.params))
            ins = [read(v) for v in eqn.invars]
            branch = jaxpr_tools.platform_branch(eqn, platforms)
            if branch is not None:
                # A platform_dependent choice: the GPU program holds the CUDA branch alone, inline
                # (its operands follow the index).
                prim, subs, ins = "closed_call", [eqn.params["branches"][branch]], ins[1:]
            if FUSED_SCOPE in str(eqn.source_info.name_stack):  # inside a fused kernel's stand-in
                outs = [self.new(v.aval) for v in eqn.outvars]
                self.eqns.append(
                    ("@boundary", [i for i in ins if i is not None], outs, mult, phase)
                )
                for v, o in zip(eqn.outvars, outs, strict=False):
                    env[v] = o
                continue
            if prim in INLINE and len(subs) >= 1:
                sub = subs[0]
                sub_j = getattr(sub, "jaxpr", sub)
                if len(sub_j.invars) == len(ins) and len(sub_j.outvars) == len(eqn.outvars):
                    inner = {cv: self.new(cv.aval) for cv in sub_j.constvars}
                    for iv, i in zip(sub_j.invars, ins, strict=False):
                        inner[iv] = i if i is not None else self.new(iv.aval)
                    phase = self.walk(sub_j, inner, mult, phase)
                    for ov, o in zip(eqn.outvars, sub_j.outvars, strict=False):
                        r = None if isinstance(o, Literal) else inner.get(o)
                        env[ov] = r if r is not None else self.new(ov.aval)
                    continue
            if subs:  # a loop or a branch: its body on its own, its boundary in HBM
                trips = int(eqn.params.get("length", 1)) if prim == "scan" else 1
                for sub in subs:
                    sub_j = getattr(sub, "jaxpr", sub)
                    inner = {v: self.new(v.aval) for v in (*sub_j.constvars, *sub_j.invars)}
                    self.walk(sub_j, inner, mult * trips, phase)
                    self.outputs.update(
                        inner[o] for o in sub_j.outvars if not isinstance(o, Literal) and o in inner
                    )
                outs = [self.new(v.aval) for v in eqn.outvars]
                self.eqns.append(
                    ("@boundary", [i for i in ins if i is not None], outs, mult, phase)
                )
            else:
                outs = [self.new(v.aval) for v in eqn.outvars]
                if prim in ("dot_general", "name"):
                    self.params[len(self.eqns)] = eqn.params
                self.eqns.append((prim, ins, outs, mult, phase))
            for v, o in zip(eqn.outvars, outs, strict=False):
                env[v] = o
        return phase


def _views(flat: _Flat) -> tuple[dict[int, int], dict[int, int], dict[int, str]]:
    """Of a walked trace: ``root`` (a free op's output → the value it views), ``producer`` (a
    value → index of the non-free eqn that makes it) and ``names`` (a viewed value → the
    activation name a ``name`` op tags it with)."""
    root: dict[int, int] = {}
    producer: dict[int, int] = {}
    names: dict[int, str] = {}
    for k, (prim, ins, outs, _, _) in enumerate(flat.eqns):
        src = next((i for i in ins if i is not None), None)
        if prim in FREE and src is not None:
            for o in outs:
                root[o] = root.get(src, src)
            if prim == "name":
                names[root.get(src, src)] = flat.params[k]["name"]
        else:
            for o in outs:
                producer[o] = k
    return root, producer, names


def phase_bytes(closed_jaxpr, weight_ways: dict | None = None) -> tuple[float, float]:
    """(bytes before :func:`marker`, bytes after it) that non-matmul fusions move (see the module
    docstring; ``weight_ways``: its sharded weights)."""
    j = getattr(closed_jaxpr, "jaxpr", closed_jaxpr)
    flat = _Flat(_with_transposes(weight_ways or {}))
    env = {v: flat.new(v.aval) for v in (*j.constvars, *j.invars)}
    flat.walk(j, env, 1, 0, top=True)
    flat.outputs.update(env[o] for o in j.outvars if not isinstance(o, Literal) and o in env)
    eqns = flat.eqns
    root, producer, names = _views(flat)
    named = set(names)

    def kind(k: int) -> str:
        prim = eqns[k][0]
        if prim in MATMUL or prim in COLLECTIVE or prim == "@boundary":
            return "boundary"
        return "free" if prim in FREE else ("reduce" if prim in ROOTS else "op")

    def op_inputs(k: int):
        """(value, producing op or None, operand position) of each input of eqn ``k`` (free views
        resolved)."""
        for pos, i in enumerate(eqns[k][1]):
            if i is not None:
                r = root.get(i, i)
                p = producer.get(r)
                yield r, (p if p is not None and kind(p) in ("op", "reduce") else None), pos

    # Materialised values: outputs, named values, whatever a matmul/collective or the other phase
    # takes.
    escapes: set[int] = {root.get(o, o) for o in flat.outputs} | named
    level: dict[int, int] = {}  # op → reductions between it and its fusion's HBM inputs
    parent = list(range(len(eqns)))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for k in range(len(eqns)):
        kd = kind(k)
        if kd == "free":
            continue
        lv = 0
        for r, p, _ in op_inputs(k):
            if p is None:
                continue
            if kd == "boundary" or eqns[p][4] != eqns[k][4]:
                escapes.add(r)
            elif kind(p) == "reduce":
                lv = max(lv, level[p] + 1)
            else:
                lv = max(lv, level[p])
        if kd == "boundary":
            continue
        level[k] = lv
        # A fusion: ops at one level joined by a value (a reduction is its root).
        for _, p, _ in op_inputs(k):
            if p is not None and kind(p) == "op" and level[p] == lv and eqns[p][4] == eqns[k][4]:
                parent[find(k)] = find(p)

    def reads_of(k: int, f: int, seen: set, out: dict) -> None:
        """HBM values fusion ``f`` reads for op ``k``: a cheaper earlier-level producer is repeated
        in it (XLA duplicates elementwise producers into each consumer fusion); a reduction's result
        is read."""
        prim = eqns[k][0]
        for r, p, pos in op_inputs(k):
            if p is not None and find(p) == f:
                continue
            if p is not None and kind(p) == "op" and r not in escapes and eqns[p][4] == eqns[k][4]:
                if p not in seen:
                    seen.add(p)
                    reads_of(p, f, seen, out)
                continue
            if pos == 0 and prim in IN_PLACE:
                continue  # the buffer updated in place
            size = (
                sum(flat.nbytes[o] for o in eqns[k][2])
                if pos == 0 and prim in SLICING
                else flat.nbytes[r]
            )
            out[r] = (eqns[k][3], max(size, out.get(r, (0, 0))[1]))

    totals = [0.0, 0.0]
    reads: dict[int, dict[int, tuple[int, int]]] = {}  # fusion → value → (multiplier, bytes read)
    for k, (prim, ins, outs, mult, phase) in enumerate(eqns):
        if k not in level:
            continue
        reads_of(k, find(k), set(), reads.setdefault(find(k), {}))
        for o in outs:
            if o in escapes or kind(k) == "reduce":
                upd = (
                    ins[IN_PLACE[prim]] if prim in IN_PLACE and len(ins) > IN_PLACE[prim] else None
                )
                totals[phase] += mult * (flat.nbytes[upd] if upd is not None else flat.nbytes[o])
    for f, vals in reads.items():
        totals[eqns[f][4]] += sum(m * size for m, size in vals.values())
    return totals[0], totals[1]


INDEXED = frozenset({"gather"}) | frozenset(k for k in IN_PLACE if k.startswith("scatter"))


def phase_indexed(closed_jaxpr) -> tuple[tuple[float, float], tuple[float, float]]:
    """Per phase (before :func:`marker`, after it): (indices, scattered bytes) of the gathers and
    scatters executed — each index of a gather or scatter (a row or an element looked up or
    updated), and the update bytes each scatter writes.  XLA:TPU runs these at a cost per index and
    scatters below HBM bandwidth, not at the bytes the fusions move
    (:attr:`tierax.costmodel.rates.Rates.index_op_s`)."""
    j = getattr(closed_jaxpr, "jaxpr", closed_jaxpr)
    out = [[0.0, 0.0], [0.0, 0.0]]
    phase = 0
    for top in j.eqns:
        if top.primitive.name == "optimization_barrier" and phase == 0:
            phase = 1  # the marker (as phase_bytes splits the trace)
        inner = int(top.params["length"]) if top.primitive.name == "scan" else 1
        nested = (
            e
            for sub in jaxprs_in_params(top.params)
            for e in jaxpr_tools._walk(getattr(sub, "jaxpr", sub), inner, ())
        )
        for eqn, mult, *_ in ((top, 1), *nested):
            if eqn.primitive.name not in INDEXED or len(eqn.invars) < 2:
                continue
            shape = tuple(eqn.invars[1].aval.shape)
            out[phase][0] += mult * math.prod(shape[:-1])
            if eqn.primitive.name != "gather" and len(eqn.invars) > 2:
                aval = eqn.invars[2].aval
                out[phase][1] += mult * math.prod(aval.shape) * aval.dtype.itemsize
    return (out[0][0], out[0][1]), (out[1][0], out[1][1])


def _is_weight_gradient(params: dict, lhs_aval, rhs_aval) -> bool:
    """xᵀ·dy: both operands contracted over the same leading dimensions, no batch dimensions."""
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    lead = tuple(range(len(lc)))
    return (
        not lb
        and not rb
        and len(lc) > 0
        and tuple(lc) == tuple(rc) == lead
        and len(lhs_aval.shape) > len(lc)
        and len(rhs_aval.shape) > len(rc)
    )


def transposed_reads(closed_jaxpr, residual_inputs: int = 0) -> dict:
    """Elements XLA:CPU's slow transposing fusions read, after :func:`marker` (the backward).

    XLA:CPU lays out a weight gradient's operand transposed for its dot (an Eigen dot with that
    operand contracted over its minor dimension; its optimised HLO of a train step).  When the
    operand is float32 and made by elementwise operations, XLA:CPU computes it in a fusion that
    writes the transposed layout.  Such a fusion of plain arrays runs about as fast as a copy;
    one that broadcasts (a literal, a row, a column) or slices a scan's stacked residual at the
    loop index runs as a loop reading each input one row apart, element by element, an order of
    magnitude slower (microbenchmarks of both).  A narrower operand, or one whose elementwise
    producers also read a row or a column (a norm's backward), is materialised first and
    transposed alone: a plain copy (the optimised HLO of the train steps of
    bench/time_fidelity.py).  Counted: each slow fusion's reads, elements × inputs the
    operand's size — ``always`` (it broadcasts a scalar: slow in every plan); else shared among the
    inputs that are residuals, slow only where a plan keeps them in the scan's stacks:
    ``residual`` (unnamed: made in the forward), ``carry`` (the first ``residual_inputs``
    inputs of the traced function: the layer's input, always stacked) and ``named`` ({name:
    elements}); a fusion reading neither is not counted.  Scan trip counts multiply in.

    Counted apart by the operand's row stride (:func:`row_aliased`): ``{"spread": counts,
    "aliased": counts}``; reading a column whose rows lie a multiple of 4 KiB apart is slower
    (``bench/investigations/row_stride.py``: the same step at two MLP widths).
    """
    j = getattr(closed_jaxpr, "jaxpr", closed_jaxpr)
    flat = _Flat()
    env = {v: flat.new(v.aval) for v in (*j.constvars, *j.invars)}
    first_inputs = {env[v] for v in j.invars[:residual_inputs]}
    flat.walk(j, env, 1, 0, top=True)
    eqns = flat.eqns
    root, producer, names = _views(flat)

    def elementwise(k: int) -> bool:
        prim = eqns[k][0]
        return not (prim in MATMUL or prim in COLLECTIVE or prim in ROOTS or prim == "@boundary")

    def chain(v: int, seen: set, found: dict) -> None:
        """The fusion's inputs (``found["inputs"]``) and whether it reads a literal."""
        v = root.get(v, v)
        p = producer.get(v)
        if p is None or eqns[p][4] != 1 or not elementwise(p) or p in seen:
            found["inputs"].add(v)
            return
        seen.add(p)
        found["literal"] |= None in eqns[p][1]
        for i in eqns[p][1]:
            if i is not None:
                chain(i, seen, found)

    transposed = {i for prim, ins, *_ in eqns if prim == "transpose" for i in ins if i is not None}
    both = {c: {"always": 0.0, "residual": 0.0, "carry": 0.0, "named": {}} for c in STRIDE_CLASSES}
    for k, (prim, ins, outs, mult, phase) in enumerate(eqns):
        if prim != "dot_general" or phase != 1 or None in ins[:2]:
            continue
        lhs, rhs = (flat.avals[i] for i in ins[:2])
        if not _is_weight_gradient(flat.params[k], lhs, rhs):
            continue
        # The operand whose free dimensions are the gradient's minor ones: the rhs, or the lhs
        # when the result is transposed (dot_general(dy, x) then a transpose, as JAX writes xᵀ·dy).
        operand = ins[0] if outs[0] in transposed else ins[1]
        aval = flat.avals[operand]
        p = producer.get(root.get(operand, operand))
        if aval.dtype != jnp.float32 or p is None or not elementwise(p) or eqns[p][4] != 1:
            continue  # a narrower dtype, a parameter, a dot's result, a residual: a plain copy
        size = math.prod(aval.shape)
        # A weight gradient contracts both operands over their leading dimensions (the tokens):
        # a row is the rest.
        tokens = len(flat.params[k]["dimension_numbers"][0][0])
        row = math.prod(aval.shape[tokens:])
        out = both["aliased" if row_aliased(row, aval.dtype) else "spread"]
        found = {"inputs": set(), "literal": False}
        chain(operand, set(), found)
        sizes = {v: math.prod(getattr(flat.avals[v], "shape", ())) for v in found["inputs"]}
        reads = mult * size * sum(n == size for n in sizes.values())
        stacked = [
            v
            for v, n in sizes.items()
            if n == size
            and (v in first_inputs or (producer.get(v) is not None and eqns[producer[v]][4] == 0))
        ]
        if any(1 < n < size for n in sizes.values()):
            continue  # a row or column too (a norm's backward): XLA:CPU materialises it first
        if found["literal"] or any(n == 1 for n in sizes.values()):
            out["always"] += reads  # it broadcasts a scalar
            continue
        for v in stacked:
            share = reads / len(stacked)
            if v in first_inputs:
                out["carry"] += share
            elif v in names:
                out["named"][names[v]] = out["named"].get(names[v], 0.0) + share
            else:
                out["residual"] += share
    return both


# The two row-stride classes of a transposing fusion's reads (tierax.costmodel.transposes).
STRIDE_CLASSES = ("spread", "aliased")
PAGE_BYTES = 4096


def row_aliased(row_elems: int, dtype) -> bool:
    """Whether rows of ``row_elems`` elements lie a multiple of 4 KiB apart.  Measured:
    ``bench/results/row_stride.json`` (the same step at rows 4096 and 4160 bytes apart) and the
    calibration's two classes; the likely mechanism, not measured: a column read at such a
    stride falls in one L1 cache set, whose index bits lie within a 4 KiB page."""
    return (row_elems * jnp.dtype(dtype).itemsize) % PAGE_BYTES == 0


def _layer_trace(layer_fn, x, params):
    def fwd_bwd(a, p, ct):
        y, vjp = jax.vjp(layer_fn, a, p)
        return y, vjp(marker(ct))

    return jax.make_jaxpr(fwd_bwd)(x, params, x)


def layer_bytes(layer_fn, x, params, weight_ways: dict | None = None) -> tuple[float, float]:
    """(forward, backward) non-matmul HBM bytes of one layer without remat (the backward traced
    through ``jax.vjp``: a custom VJP's own backward, e.g. blockwise attention's, is in it;
    ``weight_ways`` as :func:`phase_bytes`)."""
    return phase_bytes(_layer_trace(layer_fn, x, params), weight_ways)


def layer_traffic(
    layer_fn, x, params, weight_ways: dict | None = None
) -> tuple[tuple[float, float], tuple[float, float], dict, tuple]:
    """From one trace: :func:`layer_bytes` with whole weights, the same with ``weight_ways``, the
    layer's :func:`transposed_reads` (the layer input a residual: a scan saves it per layer) and
    its :func:`phase_indexed`."""
    jaxpr = _layer_trace(layer_fn, x, params)
    return (
        phase_bytes(jaxpr),
        phase_bytes(jaxpr, weight_ways),
        transposed_reads(jaxpr, residual_inputs=1),
        phase_indexed(jaxpr),
    )


def loss_bytes(hidden, weight, targets, tiles: int) -> float:
    """Non-matmul HBM bytes of the loss (forward and backward, a tiled loss's recomputation
    included): the log-sum-exp over the float32 logits, their gradient, its cast."""
    from tierax.models.loss import cross_entropy

    def fwd_bwd(h, w, t, ct):
        y, vjp = jax.vjp(lambda h, w: cross_entropy(h, w, t, tiles=tiles), h, w)
        return y, vjp(marker(ct))

    f, b = phase_bytes(
        jax.make_jaxpr(fwd_bwd)(hidden, weight, targets, jax.ShapeDtypeStruct((), jnp.float32))
    )
    return f + b


def optimizer_bytes(param_bytes: float) -> float:
    """AdamW's update per device: parameters, gradients and both moments read, parameters and
    moments written, each as large as the (sharded) parameters: 7 × their bytes."""
    return 7.0 * param_bytes


def step_fixed_bytes(inv) -> float:
    """Non-matmul HBM bytes of one step, per device, that no placement changes: every layer's
    forward
    and backward, the loss, the optimizer update (recomputation is per placement: the cost
    model's)."""
    layers = sum(
        (g.forward_hbm_bytes_per_layer + g.backward_hbm_bytes_per_layer) * g.num_layers
        for g in inv.groups
    )
    return layers + inv.loss_hbm_bytes + optimizer_bytes(inv.param_bytes)




# Calls whose body is the caller's own code (followed to the operations that made a value); every
# other operation with a body (scan, while, cond, custom_vjp_call, shard_map, a Pallas kernel)
# writes its outputs as a boundary.
_TRANSPARENT = frozenset(
    {"pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "checkpoint", "remat2"}
)
_BOUNDARY = MATMUL | COLLECTIVE | ROOTS | SLICING | frozenset(IN_PLACE)
# Elementwise operations XLA's instruction fusion counts as expensive (openxla/xla's
# InstructionFusion::IsExpensive): it does not duplicate them into several consumers, so a residual
# they make (used by the recomputed forward and by the backward) is written.
EXPENSIVE = frozenset(
    {
        "exp",
        "exp2",
        "expm1",
        "log",
        "log1p",
        "logistic",
        "tanh",
        "div",
        "pow",
        "sqrt",
        "rsqrt",
        "cbrt",
        "sin",
        "cos",
        "tan",
        "atan2",
        "erf",
        "erfc",
        "erf_inv",
        "lgamma",
        "digamma",
    }
)


class _Sources:
    """The written values a value is made from: itself where a boundary (a matmul, collective,
    reduction, slice, in-place update, an operation with a body of its own), an expensive
    elementwise operation or an input makes it; else the written values its cheap elementwise
    producers read (through free operations and transparent calls), each once."""

    def __init__(self):
        self._made: dict[int, dict] = {}
        self._memo: dict = {}
        self.avals: dict = {}  # each value's aval, by (jaxpr id, var)

    def _maker(self, jaxpr, var):
        made = self._made.get(id(jaxpr))
        if made is None:
            made = self._made[id(jaxpr)] = {o: e for e in jaxpr.eqns for o in e.outvars}
        return made.get(var)

    def of(self, jaxpr, var) -> frozenset:
        if isinstance(var, Literal):
            return frozenset()
        key = (id(jaxpr), var)
        if key in self._memo:
            return self._memo[key]
        eqn = self._maker(jaxpr, var)
        if eqn is None:  # an input of the traced function
            out = frozenset({key})
        elif eqn.primitive.name in _TRANSPARENT and (
            eqn.params.get("jaxpr", eqn.params.get("call_jaxpr")) is not None
        ):
            inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
            inner = getattr(inner, "jaxpr", inner)
            got = self.of(inner, inner.outvars[eqn.outvars.index(var)])
            out = frozenset()
            for k in got:  # an inner input stands for the caller's operand
                if k[0] == id(inner) and k[1] in inner.invars:
                    out |= self.of(jaxpr, eqn.invars[inner.invars.index(k[1])])
                else:
                    out |= {k}
        elif eqn.primitive.name in _BOUNDARY | EXPENSIVE or list(jaxprs_in_params(eqn.params)):
            out = frozenset({key})
        else:  # fusible (free operations included): what its operands are made from
            out = frozenset().union(*(self.of(jaxpr, v) for v in eqn.invars))
        self._memo[key] = out
        self.avals[key] = var.aval
        return out


def written_residual_bytes(layer_fn, x, params) -> tuple[int, int]:
    """(all, written) bytes of the residuals ``jax.vjp(layer_fn)`` keeps for one layer, the
    parameters and their casts left out (values of a parameter's shape).

    *Written*: what XLA:TPU holds when the layer is recomputed in its backward.  A residual made by
    cheap elementwise operations — SwiGLU's ``silu(a) = a·σ(a)`` and ``silu(a)·b``, a norm's
    float32 casts and products, a mask — is fused into each of its consumers, a matmul's operand
    included, and never written; the values those fusions read are (the GEMM outputs, the layer
    input, an expensive operation's output such as ``σ(a)`` or a softmax's ``exp``: XLA does not
    duplicate those, :data:`EXPENSIVE`), each once.  A residual made by a boundary (a matmul,
    reduction, gather, a custom VJP's or a scan's output) is written itself.  (Mixtral 8x7B layers
    compiled deviceless for v6e at 12 × 4096 per device, bench/results/tpu_moe_residuals.json: of
    the 6 [E, C, F] residuals JAX lists, 3 are written — a, b, σ(a) —, and the cost model's peak
    with them is within 1 % of XLA's, +54 % with all 6; a scaled-down layer with most of the HBM
    free compiles to more than either count, not yet traced.  XLA:GPU writes a cuBLAS GEMM's
    operands, so there every residual is held.)
    """
    return written_residuals(layer_fn, x, params)[:2]


def _nbytes(aval) -> int:
    return math.prod(aval.shape) * jnp.dtype(aval.dtype).itemsize


def written_residuals(layer_fn, x, params) -> tuple[int, int, frozenset[str]]:
    """:func:`written_residual_bytes` and the names (``checkpoint_name``) whose values are among the
    written residuals themselves: a name tagging a boundary's output (a matmul's, a custom call's
    such as an attention kernel's), or it through free operations (a reshape, a sharding
    constraint), rather than a cheap elementwise function of other values (a RoPE-rotated
    projection, a normalised value) or a wider cast of one.  Kept on device by a plan, such a value
    is read by the layer's backward from its saved stack and is not written again
    (:mod:`tierax.costmodel.kept_reads`)."""
    param_shapes = {tuple(p.shape) for p in jax.tree.leaves(params)}
    closed = jax.make_jaxpr(lambda a, p: jax.tree.leaves(jax.vjp(layer_fn, a, p)[1]))(x, params)
    sources = _Sources()
    total, written = 0, set()
    for var in closed.jaxpr.outvars:
        aval = getattr(var, "aval", None)
        if aval is None or tuple(aval.shape) in param_shapes:
            continue
        total += _nbytes(aval)
        written |= sources.of(closed.jaxpr, var)
    kept = [sources.avals[k] for k in written]
    names: set[str] = set()

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "name" and not isinstance(eqn.invars[0], Literal):
                # one written source as large as the value: the value itself, or it through free
                # operations
                made = sources.of(jaxpr, eqn.invars[0])
                if len(made) == 1 and (k := next(iter(made))) in written:
                    if _nbytes(sources.avals[k]) == _nbytes(eqn.invars[0].aval):
                        names.add(eqn.params["name"])
            elif eqn.primitive.name in _TRANSPARENT:
                inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
                if inner is not None:
                    walk(getattr(inner, "jaxpr", inner))

    walk(closed.jaxpr)
    written_bytes = sum(_nbytes(a) for a in kept if tuple(a.shape) not in param_shapes)
    return total, written_bytes, frozenset(names)
