#!/usr/bin/env python3
"""Where a step's time goes, op by op, from a `tierax profile` trace: every complete event of the
device's op lines summed by name (total and count, a sample of its arguments), the largest first,
and the same summed by op kind (the name without its instance number: `fusion.358` → `fusion`,
`splash_mha_fwd_no_residuals.7` → `splash_mha_fwd_no_residuals`).

Question: where do the chip's MoE steps spend the 20–27 ms the model did not predict (every MoE plan
5–17 % slower than predicted on the v5e chip), and how long does a step wait for its host stores
(the dense plan that offloads the MLP's up-projection)?
--compare reads such records side by side (the XLA Ops line of each): its total less the loops
(a `while` op spans the ops of its body), the waits in the host loads' `dynamic-slice-done` and
stores' `dynamic-update-slice-done`, the rest (the step's compute), and the largest kinds.
Answered for the head-dim-64 microbatch-8 plans of the chip check's sixteenth record (the planner's
plan, qkv-offload, remat-full): which part of the planner's plan's miss is its loads' waits and
which its compute.
Records: bench/results/chip/profiles/dense_planned_ops.json,
  bench/results/chip/profiles/hd64_lse_planned_ops.json,
  bench/results/chip/profiles/hd64_lse_qkv_ops.json,
  bench/results/chip/profiles/hd64_lse_remat_full_ops.json,
  bench/results/chip/profiles/state_mb32_ops.json
Docs: docs/concepts/mechanisms.md

    tierax profile ... --out DIR          # on the chip
    python bench/investigations/chip_op_profile.py --trace DIR --out OPS.json
    python bench/investigations/chip_op_profile.py --compare A_ops.json B_ops.json ...
"""

from __future__ import annotations

import pathlib
import re
import sys
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import _common  # noqa: E402 — the record envelope

from tierax.errors import TieraxError  # noqa: E402
from tierax.measure.trace import load_events  # noqa: E402

SCHEMA = "tierax.chip-op-profile/1"
_INSTANCE = re.compile(r"[._]\d+$")


def kind_of(name: str) -> str:
    """An op's name without its trailing instance numbers (a name that ends otherwise, such as
    `fusion.358.v_ref`, is a kind of its own)."""
    base = name
    while _INSTANCE.search(base):
        base = _INSTANCE.sub("", base)
    return base


def summarize(events, steps: int, top: int = 60, process: str = "/device:") -> dict:
    """Per line of a process whose name holds ``process``: total ms per step of each op name (the
    largest ``top``) and of each kind."""
    lines: dict = defaultdict(lambda: defaultdict(lambda: [0.0, 0, None]))
    for e in events:
        if process not in e.process:
            continue
        slot = lines[(e.process, e.thread)][e.name]
        slot[0] += e.dur_us
        slot[1] += 1
        if slot[2] is None:
            slot[2] = {k: str(v)[:300] for k, v in list(e.args.items())[:8]}
    out = []
    for (proc, thread), ops in sorted(lines.items()):
        total = sum(v[0] for v in ops.values())
        kinds: dict = defaultdict(float)
        for name, (us, _, _) in ops.items():
            kinds[kind_of(name)] += us
        ranked = sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]
        out.append(
            {
                "process": proc,
                "thread": thread,
                "total_ms_per_step": total / steps / 1e3,
                "ops": [
                    {"name": n, "ms_per_step": us / steps / 1e3, "count": c / steps, "args": a}
                    for n, (us, c, a) in ranked
                ],
                "kinds": {
                    k: v / steps / 1e3 for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])
                },
            }
        )
    return {"steps": steps, "lines": out}


# Where a step waits on its host copies in XLA:TPU's trace: each copy shows as the wait in its done
WAIT_KINDS = {"dynamic-slice-done": "loads", "dynamic-update-slice-done": "stores"}


def split_step(record: dict) -> dict:
    """A record's XLA Ops line split: the total less the loops, each kind of host-copy wait, and
    the rest (the compute), in ms per step."""
    line = next((ln for ln in record["lines"] if ln["thread"] == "XLA Ops"), None)
    if line is None:
        raise TieraxError("the record has no XLA Ops line: not a device profile")
    kinds = line["kinds"]
    total = line["total_ms_per_step"] - kinds.get("while", 0.0)
    waits = {label: kinds.get(k, 0.0) for k, label in WAIT_KINDS.items()}
    return {"ops_ms": total, **{f"{k}_wait_ms": v for k, v in waits.items()},
            "compute_ms": total - sum(waits.values()), "kinds": kinds}  # fmt: skip


def compare(paths: list[str], top: int = 14) -> int:
    """Print the records side by side (:func:`split_step`, then the largest kinds)."""
    import json

    try:
        splits = [split_step(json.loads(pathlib.Path(p).read_text())) for p in paths]
    except (OSError, ValueError, KeyError, TieraxError) as e:
        print(f"error: cannot read a profile record: {e}", file=sys.stderr)
        return 2
    names = [pathlib.Path(p).stem for p in paths]
    print(f"{'ms per step':34}" + "".join(f"{n[:26]:>28}" for n in names))
    for key in ("ops_ms", "loads_wait_ms", "stores_wait_ms", "compute_ms"):
        print(f"{key:34}" + "".join(f"{s[key]:28.2f}" for s in splits))
    kinds = {k for s in splits for k in s["kinds"] if k != "while"}
    ranked = sorted(kinds, key=lambda k: -max(s["kinds"].get(k, 0.0) for s in splits))[:top]
    for k in ranked:
        print(f"  {k[:32]:32}" + "".join(f"{s['kinds'].get(k, 0.0):28.2f}" for s in splits))
    return 0


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "chip/profiles/ops.json")
    ap.add_argument("--trace", help="a `tierax profile --out` directory or its trace file")
    ap.add_argument(
        "--compare", nargs="+", metavar="OPS.json", help="records of this script, side by side"
    )
    ap.add_argument("--steps", type=int, default=3, help="traced steps (tierax profile --steps)")
    ap.add_argument("--process", default="/device:", help="lines of processes naming this")
    args = ap.parse_args(argv)
    if args.compare:
        if args.trace:
            ap.error("--compare reads records; --trace makes one: give one of them")
        return compare(args.compare)
    if not args.trace:
        ap.error("give --trace (a profile to summarize) or --compare (records side by side)")
    try:
        events, f = load_events(args.trace)
    except TieraxError as e:
        ap.error(str(e))
    doc = _common.envelope(SCHEMA, argv) | summarize(events, args.steps, process=args.process)
    doc["trace"] = f.name
    if not doc["lines"]:
        print(f"no process names {args.process!r}: {sorted({e.process for e in events})}")
        return 2
    _common.write_record(args.out, doc)
    for line in doc["lines"]:
        print(f"{line['process']} / {line['thread']}: {line['total_ms_per_step']:.2f} ms/step")
        for k, v in list(line["kinds"].items())[:12]:
            print(f"   {k:50} {v:8.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
