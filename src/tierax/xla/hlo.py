"""A reader for XLA's scheduled HLO text, and a static host-transfer overlap check.

In a scheduled module (``is_scheduled=true``) each computation's instructions
are printed in execution order.  For every asynchronous host transfer — a
``*-start``/``*-done`` pair touching a host buffer (layout memory space ``S(5)``)
— the check replays the computation's schedule on a simple machine: each other
instruction takes its roofline time on the target (``max(FLOPs / peak, bytes / HBM
bandwidth)``), transfers in flight drain at the host-link bandwidth of their
direction, *shared equally* by the transfers in flight in that direction at each
moment (the link is full duplex: the two directions do not compete), and a
``*-done`` whose transfer has not finished stalls the stream until it has.  That
stall is the transfer's exposed time.  A loop body is replayed twice and the second
pass counts, so copies issued in one iteration and awaited in the next are seen in
steady state; a transfer executed in a loop counts once per trip.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

_DTYPE_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "s32": 4,
    "u32": 4,
    "s64": 8,
    "u64": 8,
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "f8e3m4": 1,
    "f8e8m0fnu": 1,
    "token": 0,
}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
HOST_SPACE = "S(5)"


@dataclass(frozen=True)
class Array:
    dtype: str
    dims: tuple[int, ...]
    host: bool
    # The layout's minor-to-major order, and whether it is tiled (XLA:TPU's ``T(8,128)``): what
    # the buffer takes in memory (assigned_bytes), not what identifies the array.
    minor_to_major: tuple[int, ...] = field(default=(), compare=False)
    tiled: bool = field(default=False, compare=False)

    @property
    def nbytes(self) -> float:
        return math.prod(self.dims) * _DTYPE_BYTES.get(self.dtype, 4)

    @property
    def assigned_bytes(self) -> float:
        """The bytes XLA assigns the array: under a TPU tiled layout, its two minor dimensions
        rounded up to the tile (:func:`tierax.hardware.tpu_tiling.tiled_dims_bytes`); else its
        logical bytes."""
        if not self.tiled or len(self.minor_to_major) != len(self.dims):
            return self.nbytes
        from tierax.hardware import tpu_tiling

        return tpu_tiling.tiled_dims_bytes(
            self.dims, _DTYPE_BYTES.get(self.dtype, 4), self.minor_to_major
        )


def parse_arrays(type_text: str) -> list[Array]:
    out = []
    for m in _ARRAY.finditer(type_text):
        dtype, dims, layout = m.group(1), m.group(2), m.group(3) or ""
        if dtype not in _DTYPE_BYTES:
            continue
        order = re.match(r"\{([0-9,]*)", layout)
        out.append(
            Array(
                dtype,
                tuple(int(d) for d in dims.split(",") if d),
                HOST_SPACE in layout,
                tuple(int(d) for d in order.group(1).split(",") if d) if order else (),
                ":T(" in layout,
            )
        )
    return out


def _matching(text: str, start: int, open_c: str, close_c: str) -> int:
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_c:
            depth += 1
        elif text[i] == close_c:
            depth -= 1
            if depth == 0:
                return i
    return len(text) - 1


@dataclass
class Instruction:
    name: str
    type_text: str
    opcode: str
    operands: list[str]
    attrs: str
    arrays: list[Array] = field(default_factory=list)
    literal: str = ""  # a constant's value, as written

    @property
    def out_bytes(self) -> float:
        return sum(a.nbytes for a in self.arrays)

    def attr(self, key: str) -> str | None:
        m = re.search(rf"\b{key}=%?([\w.\-]+)", self.attrs)
        return m.group(1) if m else None


@dataclass
class Module:
    computations: dict[str, list[Instruction]]
    entry: str
    by_name: dict[str, Instruction]
    roots: dict[str, str] = field(default_factory=dict)  # computation → its ROOT instruction's name

    def instruction_flops(self, ins: Instruction, _depth: int = 0) -> float:
        """Matmul/convolution FLOPs of one instruction, looking inside fusions."""
        if ins.opcode == "dot":
            return self._dot_flops(ins)
        if ins.opcode == "convolution":  # XLA:TPU writes its matmuls as convolutions
            return self._convolution_flops(ins)
        if ins.opcode == "custom-call" and "gemm" in ins.attrs:
            ops = [self.by_name[o] for o in ins.operands[:2] if o in self.by_name]
            if len(ops) == 2 and ops[0].arrays and ins.arrays:
                out = ins.arrays[0]
                m = re.search(r'"lhs_contracting_dimensions":\["?(\d+)', ins.attrs)
                k = ops[0].arrays[0].dims[int(m.group(1))] if m else 1
                return 2.0 * math.prod(out.dims) * k
            return 0.0
        called = ins.attr("calls")
        if called and called in self.computations and _depth < 8:
            return sum(self.instruction_flops(i, _depth + 1) for i in self.computations[called])
        return 0.0

    def _dot_flops(self, ins: Instruction) -> float:
        lhs = self.by_name.get(ins.operands[0]) if ins.operands else None
        m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", ins.attrs)
        if lhs is None or not lhs.arrays or not ins.arrays or not m:
            return 0.0
        k = math.prod(lhs.arrays[0].dims[int(d)] for d in m.group(1).split(",") if d)
        return 2.0 * math.prod(ins.arrays[0].dims) * k

    def _convolution_flops(self, ins: Instruction) -> float:
        """2 × the products a convolution sums: per output element the kernel's input features
        (per feature or batch group) times the window taps that land on the input, not on its
        padding or dilation holes (XLA:TPU writes matmuls as convolutions, a batch-like dimension
        often as a padded, strided or dilated window of which one tap reads the input)."""
        lhs, rhs = (self.by_name.get(o) for o in (ins.operands + ["", ""])[:2])
        m = re.search(r"dim_labels=([^_]*)_([^-]*)->([^,\s]*)", ins.attrs)
        if None in (lhs, rhs, m) or not (lhs.arrays and rhs.arrays and ins.arrays):
            return 0.0
        (ll, rl, ol) = m.groups()
        ld, rd, od = lhs.arrays[0].dims, rhs.arrays[0].dims, ins.arrays[0].dims
        if not (len(ll) == len(ld) and len(rl) == len(rd) and len(ol) == len(od)) or "i" not in rl:
            return 0.0
        spatial = sorted(c for c in rl if c.isdigit())
        window = re.search(r"window=\{([^}]*)\}", ins.attrs)
        fields = dict(f.split("=", 1) for f in window.group(1).split()) if window else {}

        def per_dim(key: str, default):
            if key not in fields:
                return [default] * len(spatial)
            return [
                tuple(int(v) for v in f.split("_")) if "_" in f else int(f)
                for f in fields[key].split("x")
            ]

        size, stride = per_dim("size", 1), per_dim("stride", 1)
        pad, lhs_dil, rhs_dil = per_dim("pad", (0, 0)), per_dim("lhs_dilate", 1), per_dim(
            "rhs_dilate", 1)  # fmt: skip
        pairs = 1
        for j, c in enumerate(spatial):
            n, o = ld[ll.index(c)], od[ol.index(c)]
            span = (n - 1) * lhs_dil[j] + 1  # the dilated input
            pairs *= sum(
                1
                for p in range(o)
                for k in range(size[j])
                if 0 <= (x := p * stride[j] + k * rhs_dil[j] - pad[j][0]) < span
                and x % lhs_dil[j] == 0
            )
        per_position = math.prod(od) / max(1, math.prod(od[ol.index(c)] for c in spatial))
        return 2.0 * per_position * pairs * rd[rl.index("i")]

    def operand_bytes(self, ins: Instruction) -> float:
        return sum(self.by_name[o].out_bytes for o in ins.operands if o in self.by_name)

    def trip_counts(self) -> dict[str, int]:
        """Computation name → how many times it runs per execution of its caller (while bodies)."""
        out: dict[str, int] = {}
        for instrs in self.computations.values():
            for ins in instrs:
                if ins.opcode == "while":
                    body = ins.attr("body")
                    m = _TRIP.search(ins.attrs)
                    if body:
                        out[body] = int(m.group(1)) if m else self._trips_from_condition(ins)
        return out

    def _int_constant(self, name: str | None) -> int | None:
        ins = self.by_name.get(name or "")
        if ins is None or ins.opcode != "constant":
            return None
        try:
            return int(ins.literal)
        except ValueError:
            return None

    def _trips_from_condition(self, loop: Instruction) -> int:
        """The trips of a ``while`` whose compile did not write its known trip count (XLA:TPU):
        its condition's root compares the counter (a tuple element of its parameter) with a
        constant, ``counter < N``, the counter starting at the constant the loop's initial tuple
        holds there (0 where not a constant) and counting up by one; 1 where the condition is not
        of that form."""
        cond = loop.attr("condition")
        root = self.by_name.get(self.roots.get(cond or "", ""))
        if root is None or root.opcode != "compare" or "direction=LT" not in root.attrs:
            return 1
        counter, bound = (self.by_name.get(o) for o in (root.operands + ["", ""])[:2])
        limit = self._int_constant(bound.name if bound else None)
        if counter is None or counter.opcode != "get-tuple-element" or limit is None:
            return 1
        index = int(re.search(r"index=(\d+)", counter.attrs).group(1))
        init = self.by_name.get(loop.operands[0]) if loop.operands else None
        start = (
            self._int_constant(init.operands[index])
            if init is not None and init.opcode == "tuple" and index < len(init.operands)
            else None
        )
        return max(1, limit - (start or 0))

    def executions(self, trips: dict[str, int] | None = None) -> dict[str, int]:
        """Computation name → executions per run of the entry (nested loop trip counts
        multiplied); ``trips``: loop body → trip count to use instead of :meth:`trip_counts`."""
        trips = self.trip_counts() if trips is None else trips
        parents: dict[str, str] = {}
        for cname, instrs in self.computations.items():
            for ins in instrs:
                for key in ("body", "condition", "calls", "to_apply"):
                    child = ins.attr(key)
                    if child:
                        parents.setdefault(child, cname)

        def count(c: str, depth: int = 0) -> int:
            if c == self.entry or c not in parents or depth > 32:
                return 1
            return trips.get(c, 1) * count(parents[c], depth + 1)

        return {c: count(c) for c in self.computations}


def _logical_lines(text: str) -> list[str]:
    """The text's lines with each instruction on one: XLA:TPU prints a Pallas kernel's
    ``frontend_attributes={kernel_metadata={...}}`` over several lines, whose continuations start at
    the first column (one with ``}}, metadata=...``), where only a computation's header or its
    closing ``}`` do."""
    out: list[str] = []
    for line in text.splitlines():
        head = line[:1]
        if (
            out
            and head not in ("", " ", "\t")
            and line.rstrip() != "}"
            and not line.startswith(("HloModule", "ENTRY", "%", "//"))
        ):
            out[-1] += line
        else:
            out.append(line)
    return out


def parse_module(text: str) -> Module:
    computations: dict[str, list[Instruction]] = {}
    by_name: dict[str, Instruction] = {}
    roots: dict[str, str] = {}
    entry = ""
    current: list[Instruction] | None = None
    for line in _logical_lines(text):
        if current is None:
            h = _HEADER.match(line)
            if h:
                comp = h.group(2)
                current = computations.setdefault(comp, [])
                if h.group(1):
                    entry = h.group(2)
            continue
        if line.startswith("}"):
            current = None
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        name, rest = m.group(2), m.group(3)
        if rest.startswith("("):
            end = _matching(rest, 0, "(", ")")
            type_text, rest = rest[: end + 1], rest[end + 1 :].lstrip()
        else:
            type_text, _, rest = rest.partition(" ")
        op_end = rest.find("(")
        opcode = rest[:op_end].strip()
        close = _matching(rest, op_end, "(", ")")
        operand_text, attrs = rest[op_end + 1 : close], rest[close + 1 :]
        operands = re.findall(r"%([\w.\-]+)", operand_text)
        ins = Instruction(name, type_text, opcode, operands, attrs, parse_arrays(type_text))
        if opcode == "constant":
            ins.literal = operand_text.strip()
        current.append(ins)
        by_name[name] = ins
        if m.group(1):
            roots[comp] = name
    if not entry and computations:
        entry = list(computations)[-1]
    return Module(computations, entry, by_name, roots)


def op_name(ins: Instruction) -> str:
    """The instruction's op_name metadata (JAX's name stack: scopes and primitive), "" if XLA kept
    none."""
    m = re.search(r'op_name="([^"]*)"', ins.attrs)
    return m.group(1) if m else ""


_PASS_THROUGH = ("bitcast", "copy", "copy-start", "copy-done", "fusion-done", "async-done")


def store_of(module: Module, ins: Instruction | None, scope: str) -> Instruction | None:
    """The instruction that writes a loop-carried buffer whose new value is ``ins`` (through async
    done → start, bitcasts and copies, stopping at one whose op_name has ``scope``); None when the
    loop only passes the buffer on (a parameter's element: the loop reads it)."""
    for _ in range(6):
        if ins is None or ins.opcode in ("parameter", "get-tuple-element"):
            return None
        if scope in op_name(ins) or ins.opcode not in _PASS_THROUGH:
            return ins
        ins = module.by_name.get(ins.operands[0]) if ins.operands else None
    return ins


def _updates_in_place(module: Module, ins: Instruction) -> bool:
    """A dynamic-update-slice, or a fusion of one (XLA's pipelined host offloading stores a loop's
    last layer after the loop): its result is its operand 0's buffer, updated."""
    called = ins.attr("calls") if ins.opcode in ("fusion", "fusion-start") else None
    root = module.by_name.get(module.roots.get(called, "")) if called else None
    return ins.opcode == "dynamic-update-slice" or (
        root is not None and root.opcode == "dynamic-update-slice"
    )


def loop_buffers(
    module: Module,
    ins: Instruction | None,
    comp_of: dict[str, str],
    loops: dict[str, list[Instruction]],
) -> list[tuple[str, int]]:
    """Every (``while``, tuple index) that carries the buffer ``ins`` is: followed through
    get-tuple-element,
    tuple, a loop body's parameter (the loop carries it; then to the loop's operand), in-place
    updates and copies/bitcasts.  ``comp_of``: instruction → its computation; ``loops``: body
    computation → its ``while``s."""
    out: list[tuple[str, int]] = []
    for _ in range(16):
        if ins is None:
            break
        if ins.opcode in _PASS_THROUGH or _updates_in_place(module, ins):  # the same buffer
            ins = module.by_name.get(ins.operands[0]) if ins.operands else None
            continue
        if ins.opcode != "get-tuple-element":
            break
        index, src = (
            int(re.search(r"index=(\d+)", ins.attrs).group(1)),
            module.by_name.get(ins.operands[0]),
        )
        if src is not None and src.opcode == "while":
            out.append((src.name, index))
            break
        if (
            src is not None
            and src.opcode == "parameter"
            and len(loops.get(comp_of[src.name], [])) == 1
        ):
            loop = loops[comp_of[src.name]][0]
            out.append((loop.name, index))
            src = module.by_name.get(loop.operands[0])
        if src is None or src.opcode != "tuple" or index >= len(src.operands):
            break
        ins = module.by_name.get(src.operands[index])
    return out


@dataclass(frozen=True)
class Transfer:
    start: str
    done: str
    computation: str
    direction: str  # "d2h" or "h2d"
    bytes: float  # per execution
    executions: int
    work_between: int  # instructions scheduled between start and done
    est_transfer_s: float  # per execution, alone on the link
    est_compute_between_s: float  # per execution: roofline time of the work between start and done
    est_stall_s: (
        float  # per execution: how long its done waited (link shared with concurrent transfers)
    )

    @property
    def est_exposed_s(self) -> float:
        return self.est_stall_s

    @property
    def est_hidden_s(self) -> float:
        return max(0.0, self.est_transfer_s - self.est_stall_s)


_FREE = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast")


def _pairs(module: Module, instrs: list[Instruction]) -> dict[str, tuple[str, str, float]]:
    """Host transfer start name → (done name, direction, bytes per execution) in one computation."""
    out = {}
    for done in instrs:
        if not done.opcode.endswith("-done") or not done.operands:
            continue
        start = module.by_name.get(done.operands[0])
        if (
            start is None
            or not start.opcode.endswith("-start")
            or not any(a.host for a in start.arrays)
        ):
            continue
        direction = "d2h" if any(a.host for a in done.arrays) else "h2d"
        host = next(a for a in start.arrays if a.host)
        # The slice moved per execution: the largest device array of the host buffer's rank, in
        # the host buffer's layout (XLA:TPU's tiles, padding included, cross the link).
        moved = [a for a in start.arrays if not a.host and len(a.dims) == len(host.dims)]
        tiling = host.assigned_bytes / host.nbytes if host.nbytes else 1.0
        out[start.name] = (
            done.name,
            direction,
            max((a.nbytes for a in moved), default=host.nbytes) * tiling,
        )
    return out


class _Link:
    """Transfers in flight, each direction's bandwidth (``bps``: direction → bytes/s) shared
    equally among its transfers."""

    def __init__(self, bps: dict[str, float]):
        self.bps, self.left = bps, {}  # start name → (direction, bytes left)

    def _rates(self) -> dict[str, float]:
        share = {d: sum(dd == d for dd, _ in self.left.values()) for d in ("d2h", "h2d")}
        return {k: self.bps[d] / share[d] for k, (d, _) in self.left.items()}

    def _next_finish(self, rates: dict[str, float]) -> float:
        return min(b / rates[k] for k, (_, b) in self.left.items())

    def advance(self, dt: float) -> None:
        """Drain the link for ``dt`` seconds (while compute runs)."""
        while dt > 1e-15 and self.left:
            rates = self._rates()
            step = min(dt, self._next_finish(rates))
            for k in list(self.left):
                d, b = self.left[k]
                b -= rates[k] * step
                if b <= 1e-6:
                    del self.left[k]
                else:
                    self.left[k] = (d, b)
            dt -= step

    def wait(self, key: str) -> float:
        """Run the link (no compute) until ``key`` is done; the time waited."""
        waited = 0.0
        while key in self.left:
            step = self._next_finish(self._rates())
            self.advance(step)
            waited += step
        return waited


def instruction_seconds(
    module: Module,
    ins: Instruction,
    *,
    peak_flops: float,
    hbm_bytes_per_s: float,
    kernel_s: Callable[[Module, Instruction], float | None] | None = None,
) -> float:
    """One execution of ``ins`` on the replay's machine: ``kernel_s``'s seconds where it prices the
    instruction (a custom kernel), else the roofline ``max(FLOPs / peak, bytes / HBM bandwidth)``
    (the module docstring)."""
    own = kernel_s(module, ins) if kernel_s is not None else None
    if own is not None:
        return own
    return max(
        module.instruction_flops(ins) / peak_flops,
        (ins.out_bytes + module.operand_bytes(ins)) / hbm_bytes_per_s,
    )


def host_transfers(
    module: Module,
    *,
    peak_flops: float,
    hbm_bytes_per_s: float,
    host_link_bps: float,
    h2d_link_bps: float | None = None,
    kernel_s: Callable[[Module, Instruction], float | None] | None = None,
) -> list[Transfer]:
    """Every asynchronous start/done pair that moves data to or from host memory, with its stall
    in a replay of the schedule (see the module docstring).  ``host_link_bps``: the link's bytes
    per second in each direction, or device → host only where ``h2d_link_bps`` gives host →
    device's.  ``kernel_s``: the seconds of an instruction the roofline cannot price (a custom
    kernel's, e.g. XLA:TPU's Pallas calls), or None to price it by the roofline."""
    link_bps = {"d2h": host_link_bps, "h2d": h2d_link_bps or host_link_bps}
    execs = module.executions()
    bodies = set(module.trip_counts())
    out = []
    for cname, instrs in module.computations.items():
        pairs = _pairs(module, instrs)
        if not pairs:
            continue
        done_of = {d: s for s, (d, _, _) in pairs.items()}
        cost = {
            ins.name: instruction_seconds(
                module,
                ins,
                peak_flops=peak_flops,
                hbm_bytes_per_s=hbm_bytes_per_s,
                kernel_s=kernel_s,
            )
            for ins in instrs
            if not (ins.opcode in _FREE or ins.opcode.endswith(("-start", "-done")))
        }
        link, stall, started = _Link(link_bps), {}, set()
        passes = 2 if cname in bodies else 1
        for n in range(passes):
            for ins in instrs:
                if ins.name in pairs:
                    link.left[ins.name] = (pairs[ins.name][1], pairs[ins.name][2])
                    started.add(ins.name)
                elif ins.name in done_of:
                    key = done_of[ins.name]
                    # Never started here (another computation issued it): count it all as exposed.
                    alone = pairs[key][2] / link_bps[pairs[key][1]]
                    waited = link.wait(key) if key in started else alone
                    if n == passes - 1:
                        stall[done_of[ins.name]] = waited
                else:
                    link.advance(cost.get(ins.name, 0.0))
        index = {ins.name: i for i, ins in enumerate(instrs)}
        for start, (done, direction, nbytes) in pairs.items():
            i, j = index.get(start), index[done]
            between = (
                [] if i is None else instrs[i + 1 : j] if i < j else instrs[i + 1 :] + instrs[:j]
            )
            out.append(
                Transfer(
                    start,
                    done,
                    cname,
                    direction,
                    nbytes,
                    execs.get(cname, 1),
                    len(between),
                    nbytes / link_bps[direction],
                    sum(cost.get(x.name, 0.0) for x in between),
                    stall.get(start, nbytes / link_bps[direction]),
                )
            )
    return out


def overlap_summary(transfers: list[Transfer]) -> dict:
    """The ``overlap`` object of ``tierax compile --json`` (totals over executions).

    Per direction: ``est_transfer_s`` is the link's busy time (the bytes at its bandwidth),
    ``est_exposed_s`` the time the stream waited for those transfers, ``est_hidden_s`` the rest, so
    hidden + exposed = transfer.  (Summing each transfer's own hidden part would not add up: a
    transfer that shares the link can wait longer than it takes alone, and the others' time it
    waited through is then counted hidden for them too.)
    """
    by_dir = {}
    for d in ("d2h", "h2d"):
        ts = [t for t in transfers if t.direction == d]
        busy = sum(t.est_transfer_s * t.executions for t in ts)
        # While the stream waits on this direction, its link is moving this step's bytes, so the
        # wait cannot exceed the busy time (a loop replay's carried-over copies can nudge it above).
        exposed = min(busy, sum(t.est_exposed_s * t.executions for t in ts))
        by_dir[d] = {
            "transfers": sum(t.executions for t in ts),
            "transfer_bytes": sum(t.bytes * t.executions for t in ts),
            "est_transfer_s": busy,
            "est_hidden_s": busy - exposed,
            "est_exposed_s": exposed,
        }
    return {
        "transfers": sum(t.executions for t in transfers),
        "transfer_bytes": sum(t.bytes * t.executions for t in transfers),
        **{
            k: sum(v[k] for v in by_dir.values())
            for k in ("est_transfer_s", "est_hidden_s", "est_exposed_s")
        },
        "by_direction": by_dir,
    }


def host_buffers(module: Module) -> list[Array]:
    """Distinct host (S(5)) buffers written by the forward pass: the outputs of d2h dones."""
    seen = []
    for instrs in module.computations.values():
        for ins in instrs:
            if ins.opcode.endswith("-done"):
                seen.extend(a for a in ins.arrays if a.host)
    return seen


FP8_TYPES = frozenset({"f8e4m3fn", "f8e5m2", "f8e4m3", "f8e4m3fnuz", "f8e5m2fnuz"})
CUBLASLT_FP8_CALL = "__cublas$lt$matmul$f8"
# MXFP8 (quantization: mxfp8): JAX lowers jax.nn.scaled_matmul to this custom call, which XLA:GPU
# rewrites on Blackwell into cuDNN's block-scaled GEMM (BLOCK_SCALED_CUDNN_CALL); one left as
# written was not rewritten.
BLOCK_SCALED_CUDNN_CALL = "__cudnn$blockScaledDot"
BLOCK_SCALED_OP_CALL = "__op$block_scaled_dot"


def fp8_gemms(module: Module) -> dict[str, int]:
    """The fp8 GEMMs in a compiled program, counted as written (a scanned layer's once):
    ``cublaslt``: cuBLASLt fp8 custom calls (``__cublas$lt$matmul$f8``, what XLA:GPU emits after
    autotuning on a device); ``dot``: ``dot`` instructions, inside fusions included (a deviceless
    compile's Triton GEMM fusions), whose two operands are fp8; ``block_scaled``: cuDNN's
    block-scaled (MXFP8) GEMM calls (``__cudnn$blockScaledDot``); ``block_scaled_unrewritten``:
    JAX's ``__op$block_scaled_dot`` calls XLA left as they were."""
    cublaslt = dot = block = unrewritten = 0
    for ins in module.by_name.values():
        if ins.opcode == "custom-call":
            if f'custom_call_target="{CUBLASLT_FP8_CALL}"' in ins.attrs:
                cublaslt += 1
            elif f'custom_call_target="{BLOCK_SCALED_CUDNN_CALL}"' in ins.attrs:
                block += 1
            elif f'custom_call_target="{BLOCK_SCALED_OP_CALL}"' in ins.attrs:
                unrewritten += 1
        elif ins.opcode == "dot" and len(ins.operands) == 2:
            kinds = [module.by_name.get(o) for o in ins.operands]
            if all(k is not None and k.arrays and k.arrays[0].dtype in FP8_TYPES for k in kinds):
                dot += 1
    return {
        "cublaslt": cublaslt,
        "dot": dot,
        "block_scaled": block,
        "block_scaled_unrewritten": unrewritten,
    }
