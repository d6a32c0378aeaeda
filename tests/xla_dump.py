"""What the MaxText loss-rule tests read from an XLA dump (``--xla_dump_to``) of MaxText's train
step: the scheduled module's text, its preallocated temp's values with their offsets and live
ranges, and the temp in use at one instruction."""

from __future__ import annotations

import pathlib
import re


def dump_text(dump: pathlib.Path, suffix: str) -> str:
    found = sorted(dump.glob(f"*jit_train_step*after_optimizations{suffix}"))
    assert found, f"no *jit_train_step*after_optimizations{suffix} in {dump}"
    return found[-1].read_text()


def temp_values(dump: pathlib.Path) -> dict[str, dict]:
    """The preallocated temp's values: name → shape, bytes, offset, live range, the JAX op."""
    assignment = dump_text(dump, "-buffer-assignment.txt")
    block = next(
        b
        for b in re.split(r"^(?=allocation \d+:)", assignment, flags=re.M)
        if re.match(r"allocation \d+: size \d+, page 0, preallocated-temp:", b)
    )
    live = dump_text(dump, "-live-range.txt").split("BufferLiveRange:")[1]
    ranges = {n: (int(s), int(e)) for n, s, e in re.findall(r"^\s+(\S+):(\d+)-(\d+)$", live, re.M)}
    ops = {}
    for line in dump_text(dump, ".txt").splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*op_name=\"([^\"]*)\"", line)
        if m:
            ops[m.group(1)] = m.group(2)
    out = {}
    for name, size, offset, shape in re.findall(
        r"value: <\d+ (\S+)(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (\w+\[[\d,]*\])", block
    ):
        key = name if "{" in name else name + "{}"
        if key in ranges:
            out[key] = {
                "shape": shape,
                "bytes": int(size),
                "offset": int(offset),
                "range": ranges[key],
                "op": ops.get(name.split("{")[0], ""),
            }
    return out


def live_at(values: dict, t: int) -> int:
    """Bytes of the temp in use at instruction ``t`` (values sharing an offset counted once)."""
    spans = sorted(
        (v["offset"], v["offset"] + v["bytes"])
        for v in values.values()
        if v["range"][0] <= t <= v["range"][1]
    )
    total, end = 0, -1
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total
