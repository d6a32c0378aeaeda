"""Profiler traces → per-step compute, host↔device transfers and their overlap.

:func:`capture` runs a few train steps under ``jax.profiler.trace`` (each step inside
a ``StepTraceAnnotation`` named :data:`STEP_ANNOTATION`) and keeps what the profiler
writes: ``perfetto_trace.json.gz`` (open it at https://ui.perfetto.dev) and the
``.xplane.pb`` (TensorBoard / XProf).  :func:`load_events` reads either file into
:class:`Event` s; :func:`analyze` does the interval arithmetic.

How events are classified (the rules the numbers rest on):

* **GPU** (processes named ``/device:GPU:N``): only the per-stream lines
  (threads named ``Stream #…``) are read — the derived lines (``XLA Ops``,
  ``XLA Modules``, ``Steps``) repeat the same work and would double-count.  On a
  stream line, ``MemcpyH2D``/``MemcpyHtoD`` is a host→device transfer,
  ``MemcpyD2H``/``MemcpyDtoH`` device→host (or the direction in the
  ``memcpy_details`` argument's ``kind_src``/``kind_dst``); other copies and memsets
  (device↔device, peer) are neither; everything else is compute.  Bytes come from
  ``memcpy_details`` (``size:N``) or a ``bytes``/``size`` argument.
* **TPU** (processes named ``/device:TPU:N``): the ``XLA Ops`` line.  XLA:TPU's trace shows a host
  copy only as the wait in its ``*-done`` op (the DMA itself is not on the line): a
  ``dynamic-update-slice-done``/``copy-done`` whose result is in host memory (``S(5)`` in its
  ``long_name``) is a device→host store, a ``dynamic-slice-done``/``copy-done`` reading host memory
  a host→device load; its bytes are the slice's (the update's shape, or the result's).  Such a
  wait is the copy's exposed time and nothing else runs on the core meanwhile, so ``busy_s`` and
  ``exposed_s`` are the waits, ``overlap_s`` 0, and no bandwidth is reported.  Ops that contain
  others on the line (``while``, ``conditional``, ``call``) are neither compute nor transfer.
* **CPU** (no device process): the XLA ops (events with an ``hlo_op`` argument) on the
  host's threads are compute.  There is no separate device memory and XLA:CPU strips
  host-offload annotations, so a CPU trace has no host↔device transfers and none are
  reported.

Per step and device: ``compute_s`` is the length of the union of compute intervals
(concurrent streams or threads count once); per direction, ``busy_s`` is the union of
that direction's copies, ``overlap_s`` the part of it during which compute runs,
``exposed_s = busy_s − overlap_s``, and ``bandwidth = bytes / busy_s``.  The transfer
totals use the union of both directions.  An event belongs to the step in whose
window it starts (a window runs from one step annotation's start to the next's).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import pathlib
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from tierax.errors import TieraxError

STEP_ANNOTATION = "tierax_step"
CPU_NOTE = (
    "CPU backend: no host↔device transfers exist here (XLA:CPU has no separate device memory and "
    "strips host-offload annotations), so transfer, overlap and bandwidth figures are not "
    "applicable; run on a GPU to measure them"
)
TPU_NOTE = (
    "TPU: XLA:TPU's trace shows each host copy as the wait in its *-done op, not the copy itself: "
    "transfer and exposed time are those waits (nothing else runs on the core meanwhile), the "
    "copies' overlap with compute and their bandwidth are not observed"
)
_H2D = re.compile(r"memcpy\s*_?(h2d|htod)", re.I)
_D2H = re.compile(r"memcpy\s*_?(d2h|dtoh)", re.I)
_OTHER_COPY = re.compile(r"^(memcpy|memset)", re.I)
_SIZE = re.compile(r"size:(\d+)")
_KIND = re.compile(r"kind_(src|dst):(\w+)")
_HOST_KINDS = {"pinned", "pageable", "host", "unpinned", "managed_host"}
# XLA:TPU: the async op whose done waits for a copy, the host memory space in a layout, a shape
_TPU_DONE = re.compile(r"^(dynamic-update-slice|dynamic-slice|copy)-done")
_TPU_CONTAINER = re.compile(r"^(while|conditional|call)\b")
_SHAPE = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\](\{[^}]*\})?")
_DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "s32": 4, "u32": 4, "s8": 1, "u8": 1}
_DTYPE_BYTES |= {"pred": 1, "s16": 2, "u16": 2, "s64": 8, "u64": 8, "f8e4m3fn": 1, "f8e5m2": 1}


@dataclass(frozen=True)
class Event:
    """One complete ('X') trace event; times in microseconds."""

    process: str
    thread: str
    name: str
    start_us: float
    dur_us: float
    args: Mapping = field(default_factory=dict)

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


# --- reading ---------------------------------------------------------------------------


def find_trace_file(path: str | os.PathLike) -> pathlib.Path:
    """The trace to read under ``path`` (a file, or a directory searched recursively).

    Prefers the newest ``perfetto_trace.json.gz``, then ``*.trace.json.gz``, then ``*.xplane.pb``.

    Raises:
      TieraxError: ``path`` does not exist or holds no trace.
    """
    p = pathlib.Path(path)
    if p.is_file():
        return p
    if not p.is_dir():
        raise TieraxError(
            f"trace {str(p)!r}: no such file or directory; give a `tierax profile --out` directory "
            "or a perfetto_trace.json.gz / .xplane.pb file"
        )
    for pattern in (
        "perfetto_trace.json.gz",
        "perfetto_trace.json",
        "*.trace.json.gz",
        "*.xplane.pb",
    ):
        found = sorted(p.rglob(pattern), key=lambda f: (f.stat().st_mtime, str(f)))
        if found:
            return found[-1]
    raise TieraxError(
        f"trace directory {str(p)!r} holds no trace (no perfetto_trace.json.gz, *.trace.json.gz or "
        "*.xplane.pb); record one with `tierax profile --out DIR`"
    )


def load_events(path: str | os.PathLike) -> tuple[list[Event], pathlib.Path]:
    """(complete events, the file read) from a trace file or directory; see
    :func:`find_trace_file`."""
    f = find_trace_file(path)
    try:
        if f.name.endswith(".xplane.pb"):
            return events_from_xplane(f), f
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt") as fh:
            return events_from_chrome_json(json.load(fh)), f
    except TieraxError:
        raise
    except (OSError, ValueError, EOFError) as e:
        raise TieraxError(
            f"trace {str(f)!r} could not be read ({e}); record it again with `tierax profile`"
        ) from None


def events_from_chrome_json(data) -> list[Event]:
    """Complete events of a Chrome/Perfetto JSON trace (``{"traceEvents": [...]}`` or a list)."""
    raw = data.get("traceEvents") if isinstance(data, Mapping) else data
    if not isinstance(raw, list):
        raise TieraxError("not a Chrome/Perfetto trace: expected a 'traceEvents' list")
    procs: dict = {}
    threads: dict = {}
    for e in raw:
        if isinstance(e, Mapping) and e.get("ph") == "M":
            if e.get("name") == "process_name":
                procs[e.get("pid")] = str(e.get("args", {}).get("name", ""))
            elif e.get("name") == "thread_name":
                threads[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name", ""))
    out = []
    for e in raw:
        if not isinstance(e, Mapping) or e.get("ph") != "X" or "ts" not in e:
            continue
        pid, tid = e.get("pid"), e.get("tid")
        out.append(
            Event(
                procs.get(pid, str(pid)),
                threads.get((pid, tid), str(tid)),
                str(e.get("name", "")),
                float(e["ts"]),
                float(e.get("dur", 0.0)),
                dict(e.get("args") or {}),
            )
        )
    return out


def events_from_xplane(path: str | os.PathLike) -> list[Event]:
    """Events of an ``.xplane.pb`` via ``jax.profiler.ProfileData`` (no extra package)."""
    import jax

    data = jax.profiler.ProfileData.from_file(str(path))
    out = []
    with warnings.catch_warnings():
        # jaxlib 0.12's stats iterator type has no __module__, which Python 3.12 warns about while
        # iterating; a warnings filter that turns it into an error aborts the process inside
        # jaxlib's iterator instead of raising.
        warnings.filterwarnings(
            "ignore", message=r"builtin type \w+ has no __module__", category=DeprecationWarning
        )
        _collect(data, out)
    return out


def _collect(data, out: list) -> None:
    for plane in data.planes:
        for line in plane.lines:
            for ev in line.events:
                out.append(
                    Event(
                        plane.name,
                        line.name,
                        ev.name,
                        ev.start_ns / 1e3,
                        ev.duration_ns / 1e3,
                        {k: v for k, v in ev.stats},
                    )
                )


# --- interval arithmetic -------------------------------------------------------------


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same points."""
    out: list[list[float]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length of disjoint intervals."""
    return sum(e - s for s, e in intervals)


def intersection_length(
    a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]
) -> float:
    """Length of the intersection of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


# --- classification ------------------------------------------------------------------


def is_device_process(process: str) -> bool:
    return process.startswith("/device:")


def _tpu_shapes(text: str) -> list[tuple[int, bool]]:
    """(bytes, in host memory) of each shape in an XLA:TPU ``long_name`` fragment."""
    out = []
    for dtype, dims, layout in _SHAPE.findall(text):
        if dtype in _DTYPE_BYTES:
            n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
            out.append((n * _DTYPE_BYTES[dtype], "S(5)" in (layout or "")))
    return out


def tpu_host_copy(ev: Event) -> tuple[str, int] | None:
    """(direction, bytes) of an XLA:TPU op that waits for a host copy (module docstring), else
    None."""
    if not ev.process.startswith("/device:TPU") or not _TPU_DONE.match(ev.name):
        return None
    text = str(ev.args.get("long_name", ""))
    if " = " not in text:
        return None
    rhs = text.split(" = ", 1)[1]
    first = _SHAPE.search(rhs)  # the result's shape (a layout holds parentheses: T(8,128))
    if first is None:
        return None
    res, ops = _tpu_shapes(first.group(0)), _tpu_shapes(rhs[first.end() :])
    if not res:
        return None
    if ev.name.startswith("dynamic-update-slice") and res[0][1]:
        return "d2h", (ops[1][0] if len(ops) > 1 else res[0][0])  # the update's bytes
    if ev.name.startswith("copy") and res[0][1]:
        return "d2h", res[0][0]
    if not res[0][1] and ops and ops[0][1]:
        return "h2d", res[0][0]
    return None


def transfer_direction(ev: Event) -> str | None:
    """'h2d', 'd2h', 'other' (device↔device copies, memsets) or None (not a copy)."""
    tpu = tpu_host_copy(ev)
    if tpu is not None:
        return tpu[0]
    if _H2D.search(ev.name):
        return "h2d"
    if _D2H.search(ev.name):
        return "d2h"
    details = str(ev.args.get("memcpy_details", ""))
    if details or _OTHER_COPY.match(ev.name):
        kinds = dict(_KIND.findall(details))
        src_host, dst_host = kinds.get("src") in _HOST_KINDS, kinds.get("dst") in _HOST_KINDS
        if src_host and not dst_host:
            return "h2d"
        if dst_host and not src_host:
            return "d2h"
        return "other"
    return None


def transfer_bytes(ev: Event) -> int:
    tpu = tpu_host_copy(ev)
    if tpu is not None:
        return tpu[1]
    m = _SIZE.search(str(ev.args.get("memcpy_details", "")))
    if m:
        return int(m.group(1))
    for key in ("bytes", "num_bytes", "size", "bytes_transferred"):
        v = ev.args.get(key)
        if v is not None and str(v).isdigit():
            return int(v)
    return 0


def _device_lines(events: Sequence[Event]) -> dict[str, list[Event]]:
    """Device → the events that are real device work (see the module docstring)."""
    by_dev: dict[str, list[Event]] = {}
    devices = sorted({e.process for e in events if is_device_process(e.process)})
    for d in devices:
        evs = [e for e in events if e.process == d]
        streams = [e for e in evs if e.thread.lower().startswith("stream")]
        # Without stream lines (not a GPU trace), fall back to the op line.
        by_dev[d] = streams or [e for e in evs if e.thread == "XLA Ops"]
    if not devices:  # CPU backend: XLA ops run on host threads
        host = [e for e in events if "hlo_op" in e.args and not e.name.startswith("end: ")]
        if host:
            by_dev[host[0].process] = host
    return by_dev


# --- analysis ------------------------------------------------------------------------


@dataclass(frozen=True)
class Direction:
    """One transfer direction within one step; seconds and bytes (bandwidth None without bytes)."""

    busy_s: float
    bytes: int
    overlap_s: float
    exposed_s: float
    copies: int
    waits_only: bool = False  # XLA:TPU: the copies' waits, not the copies (module docstring)

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        if self.waits_only:
            return None
        return self.bytes / self.busy_s if self.bytes and self.busy_s > 0 else None

    def to_json(self) -> dict:
        return asdict(self) | {"bandwidth_bytes_per_s": self.bandwidth_bytes_per_s}


@dataclass(frozen=True)
class StepBreakdown:
    """Where one step's time went on one device (seconds)."""

    step: int
    device: str
    wall_s: float | None  # the step annotation's duration on the host (None without annotations)
    compute_s: float
    h2d: Direction
    d2h: Direction
    transfer_s: float  # union of both directions
    overlap_s: float  # transfer time during which compute runs
    exposed_s: float  # transfer time with no compute running

    def to_json(self) -> dict:
        d = asdict(self)
        d["h2d"], d["d2h"] = self.h2d.to_json(), self.d2h.to_json()
        return d


@dataclass(frozen=True)
class TraceAnalysis:
    """Per-step breakdowns of a trace, with what the trace could and could not show."""

    source: str
    backend: str  # gpu | tpu | cpu | other
    steps: tuple[StepBreakdown, ...]
    transfers_observed: bool
    notes: tuple[str, ...] = ()

    def summary(self) -> dict:
        """Means over the analysed steps (per device, then the mean of devices)."""
        if not self.steps:
            return {"steps": 0}
        n = len(self.steps)

        def mean(f):
            return sum(f(s) for s in self.steps) / n

        out = {
            "steps": len({s.step for s in self.steps}),
            "compute_s": mean(lambda s: s.compute_s),
            "transfer_s": mean(lambda s: s.transfer_s),
            "overlap_s": mean(lambda s: s.overlap_s),
            "exposed_transfer_s": mean(lambda s: s.exposed_s),
            "h2d_bytes": mean(lambda s: s.h2d.bytes),
            "d2h_bytes": mean(lambda s: s.d2h.bytes),
        }
        walls = [s.wall_s for s in self.steps if s.wall_s is not None]
        out["wall_s"] = sum(walls) / len(walls) if walls else None
        for d in ("h2d", "d2h"):
            busy = sum(getattr(s, d).busy_s for s in self.steps)
            nbytes = sum(getattr(s, d).bytes for s in self.steps)
            seen = not any(getattr(s, d).waits_only for s in self.steps)  # TPU: waits, not copies
            out[f"{d}_bandwidth_bytes_per_s"] = (
                nbytes / busy if seen and busy > 0 and nbytes else None
            )
        return out

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "backend": self.backend,
            "transfers_observed": self.transfers_observed,
            "notes": list(self.notes),
            "summary": self.summary(),
            "steps": [s.to_json() for s in self.steps],
        }


def step_windows(
    events: Sequence[Event], name: str = STEP_ANNOTATION
) -> list[tuple[int, float, float, float | None]]:
    """(step, window start, window end, annotated duration) from step annotations, in time order.

    Falls back to any event with a ``step_num`` argument; with neither, the whole trace is one step
    (-1).
    """
    marks = [e for e in events if e.name == name] or [e for e in events if "step_num" in e.args]
    marks.sort(key=lambda e: e.start_us)
    if not marks:
        return [(-1, -math.inf, math.inf, None)]
    out = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start_us if i + 1 < len(marks) else math.inf
        step = (
            int(m.args.get("step_num", i))
            if str(m.args.get("step_num", i)).lstrip("-").isdigit()
            else i
        )
        out.append((step, m.start_us, end, m.dur_us / 1e6))
    return out


def _direction(
    evs: list[Event], compute: list[tuple[float, float]], waits_only: bool = False
) -> Direction:
    u = union((e.start_us, e.end_us) for e in evs)
    busy = length(u)
    ov = intersection_length(u, compute)
    nbytes = sum(transfer_bytes(e) for e in evs)
    return Direction(busy / 1e6, nbytes, ov / 1e6, (busy - ov) / 1e6, len(evs), waits_only)


def analyze(
    events: Sequence[Event], *, source: str = "", step_name: str = STEP_ANNOTATION
) -> TraceAnalysis:
    """Per step and device: compute time, transfers per direction, their overlap with compute."""
    lines = _device_lines(events)
    backend = (
        "gpu"
        if any(d.startswith("/device:GPU") for d in lines)
        else "tpu"
        if any(d.startswith("/device:TPU") for d in lines)
        else "cpu"
        if lines and not any(is_device_process(d) for d in lines)
        else "other"
    )
    windows = step_windows(events, step_name)
    steps = []
    other_copies = 0
    for dev, evs in lines.items():
        for step, lo, hi, wall in windows:
            in_step = [e for e in evs if lo <= e.start_us < hi]
            tpu = dev.startswith("/device:TPU")
            if tpu:  # an op that holds others spans them: neither compute nor a copy
                in_step = [e for e in in_step if not _TPU_CONTAINER.match(e.name)]
            kinds = [(e, transfer_direction(e)) for e in in_step]
            other_copies += sum(k == "other" for _, k in kinds)
            compute = union((e.start_us, e.end_us) for e, k in kinds if k is None)
            h2d = _direction([e for e, k in kinds if k == "h2d"], compute, tpu)
            d2h = _direction([e for e, k in kinds if k == "d2h"], compute, tpu)
            transfers = union((e.start_us, e.end_us) for e, k in kinds if k in ("h2d", "d2h"))
            t = length(transfers)
            ov = intersection_length(transfers, compute)
            steps.append(
                StepBreakdown(
                    step,
                    dev,
                    wall,
                    length(compute) / 1e6,
                    h2d,
                    d2h,
                    t / 1e6,
                    ov / 1e6,
                    (t - ov) / 1e6,
                )
            )
    observed = any(s.h2d.copies or s.d2h.copies for s in steps)
    notes = []
    if not lines:
        notes.append("no device work found in the trace (no XLA ops, no device streams)")
    if backend == "cpu":
        notes.append(CPU_NOTE)
    elif backend == "tpu" and observed:
        notes.append(TPU_NOTE)
    elif not observed:
        notes.append("no host↔device copies in the analysed steps")
    if other_copies:
        notes.append(
            f"{other_copies} device↔device copies or memsets counted as neither compute nor "
            f"transfer"
        )
    if windows and windows[0][0] == -1:
        notes.append(f"no '{step_name}' annotations: the whole trace is analysed as one step")
    return TraceAnalysis(source, backend, tuple(steps), observed, tuple(notes))


def analyze_trace(path: str | os.PathLike) -> TraceAnalysis:
    """:func:`analyze` of the trace found at ``path`` (file or directory)."""
    events, f = load_events(path)
    return analyze(events, source=str(f))


def timeline(
    events: Sequence[Event], step: int | None = None, step_name: str = STEP_ANNOTATION
) -> tuple[dict[str, list[tuple[float, float]]], int, float]:
    """Lanes of one step for plotting: {'compute' | 'host→device' | 'device→host': [(start_ms,
    dur_ms)]}.

    Times are relative to the step's start.  ``step`` None picks the last step.
    Returns (lanes, step, window start in µs).
    """
    windows = step_windows(events, step_name)
    chosen = windows[-1] if step is None else next((w for w in windows if w[0] == step), None)
    if chosen is None:
        raise TieraxError(
            f"step {step} is not in the trace; steps: {', '.join(str(w[0]) for w in windows)}"
        )
    s, lo, hi, _ = chosen
    lines = _device_lines(events)
    evs = [e for d in sorted(lines)[:1] for e in lines[d] if lo <= e.start_us < hi]
    origin = lo if math.isfinite(lo) else min((e.start_us for e in evs), default=0.0)
    lanes: dict[str, list[tuple[float, float]]] = {
        "compute": [],
        "host→device": [],
        "device→host": [],
    }
    names = {None: "compute", "h2d": "host→device", "d2h": "device→host"}
    for e in evs:
        k = transfer_direction(e)
        if k in names:
            lanes[names[k]].append(((e.start_us - origin) / 1e3, e.dur_us / 1e3))
    for k, iv in lanes.items():  # merge for drawing: fewer, cleaner bars
        lanes[k] = [(a, b - a) for a, b in union((x, x + d) for x, d in iv)]
    return lanes, s, origin
