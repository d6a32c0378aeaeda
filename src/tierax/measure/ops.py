"""Per-op profile of a compiled step: each executed HLO op's time from a profiler trace, grouped
by what the op does, with its FLOPs and bytes from the optimised HLO text.

Categories (:func:`classify`): ``matmul`` (a dot or convolution, or a fusion around one),
``transpose`` (a fusion whose computation transposes: XLA:CPU emits it as a loop that reads its
inputs element by element across rows, where a plain copy streams them), ``fill`` (a fusion or
op that only broadcasts a constant: zeroed gradient accumulators), ``copy`` (a copy or
transpose outside a fusion), ``non-matmul`` (every other fusion, reduction, slice or update)
and ``control`` (loops, conditionals, calls: their own bookkeeping; the ops of their bodies are
counted where they belong).  Bytes are the op's operands and result as the HLO types them (an
upper bound for ops that read a slice).  bench/time_fidelity.py and bench/gpu_check.py trace the
time model's terms to measured causes with it.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable

CATEGORIES = ("matmul", "transpose", "fill", "copy", "non-matmul", "control")
_ITEM = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "bf16": 2,
    "f16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_SHAPE = re.compile(r"\b(" + "|".join(_ITEM) + r")\[([\d,]*)\]")
_INST = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([\w\-]+)\((.*)$")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_CONTRACT = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_GEMM_CALL = re.compile(r'custom_call_target="[^"]*(gemm|matmul)', re.IGNORECASE)
_CONTROL = frozenset(
    {
        "while",
        "conditional",
        "call",
        "tuple",
        "get-tuple-element",
        "parameter",
        "constant",
        "bitcast",
        "after-all",
        "partition-id",
        "replica-id",
    }
)
_FILL_ONLY = frozenset({"parameter", "constant", "broadcast", "bitcast", "reshape"})


def _shapes(text: str) -> list[tuple[str, list[int]]]:
    return [(d, [int(x) for x in dims.split(",") if x]) for d, dims in _SHAPE.findall(text)]


def _nbytes(text: str) -> int:
    return sum(_ITEM[d] * math.prod(dims) for d, dims in _shapes(text))


def _operands(rest: str) -> list[str]:
    """Operand names of an instruction, from the text after its opening parenthesis."""
    depth, args = 1, ""
    for ch in rest:
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            break
        args += ch
    return re.findall(r"%([\w.\-]+)", args)


def parse(hlo_text: str) -> dict[str, dict[str, dict]]:
    """``{computation: {instruction: {"type", "op", "operands", "text"}}}`` of an HLO module."""
    comps: dict[str, dict[str, dict]] = {}
    cur = None
    for line in hlo_text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{") and "(" in line:
            head = line.split()
            cur = comps.setdefault((head[1] if head[0] == "ENTRY" else head[0]).lstrip("%"), {})
            continue
        if line.startswith("}"):
            cur = None
            continue
        m = _INST.match(line) if cur is not None else None
        if m:
            name, typ, op, rest = m.groups()
            cur[name] = {"type": typ, "op": op, "operands": _operands(rest), "text": line}
    return comps


def _dot_flops(inst: dict, comp: dict) -> float:
    """2 × the result's elements × the contracted size (from the lhs operand's dimensions)."""
    out = _shapes(inst["type"])
    lhs = comp.get(inst["operands"][0]) if inst["operands"] else None
    m = _CONTRACT.search(inst["text"])
    if not out or lhs is None or m is None:
        return 0.0
    lhs_dims = _shapes(lhs["type"])[0][1]
    k = math.prod(lhs_dims[int(i)] for i in m.group(1).split(",") if i)
    return 2.0 * math.prod(out[0][1]) * k


def classify(hlo_text: str) -> dict[str, dict]:
    """``{op name: {"category", "flops", "bytes"}}`` of every instruction outside fusions."""
    comps = parse(hlo_text)
    called = {
        c
        for comp in comps.values()
        for i in comp.values()
        if i["op"] == "fusion"
        for c in _CALLS.findall(i["text"])
    }
    out = {}
    for cname, comp in comps.items():
        if cname in called:
            continue
        for name, inst in comp.items():
            op = inst["op"]
            operands = [comp[a]["type"] for a in inst["operands"] if a in comp]
            nbytes = _nbytes(inst["type"]) + sum(_nbytes(t) for t in operands)
            flops = 0.0
            if op == "fusion":
                m = _CALLS.search(inst["text"])
                body = comps.get(m.group(1), {}) if m else {}
                ops = {i["op"] for i in body.values()}
                if ops & {"dot", "convolution"}:
                    cat = "matmul"
                    flops = sum(_dot_flops(i, body) for i in body.values() if i["op"] == "dot")
                elif "transpose" in ops:
                    cat = "transpose"
                elif ops <= _FILL_ONLY:
                    cat = "fill"
                else:
                    cat = "non-matmul"
            elif op in ("dot", "convolution"):
                cat, flops = "matmul", _dot_flops(inst, comp) if op == "dot" else 0.0
            elif op == "custom-call" and _GEMM_CALL.search(inst["text"]):  # cuBLAS, oneDNN
                cat = "matmul"
            elif op == "broadcast":
                cat = "fill"
            elif op in ("copy", "transpose"):
                cat = "copy"
            elif op in _CONTROL:
                cat = "control"
            else:
                cat = "non-matmul"
            out[name] = {"category": cat, "flops": flops, "bytes": nbytes}
    return out


def summarize(events: Iterable, ops: dict[str, dict], steps: int = 1) -> dict:
    """Per category: seconds, FLOPs and bytes per step, summed over a trace's executed ops (events
    with an ``hlo_op`` argument, e.g. :func:`tierax.measure.trace.load_events`) ÷ ``steps``."""
    agg: dict = defaultdict(lambda: {"s": 0.0, "flops": 0.0, "bytes": 0.0, "ops": 0})
    unknown = 0.0
    for e in events:
        name = e.args.get("hlo_op") if hasattr(e, "args") else None
        if name is None:
            continue
        info = ops.get(name)
        if info is None:
            unknown += e.dur_us / 1e6
            continue
        a = agg[info["category"]]
        a["s"] += e.dur_us / 1e6
        a["flops"] += info["flops"]
        a["bytes"] += info["bytes"]
        a["ops"] += 1
    out = {c: {k: v / steps for k, v in agg[c].items()} for c in CATEGORIES if c in agg}
    if unknown:
        out["unclassified"] = {"s": unknown / steps}
    return out
