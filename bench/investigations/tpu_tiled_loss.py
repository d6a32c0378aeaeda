#!/usr/bin/env python3
"""What XLA:TPU holds at a tiled loss (``loss_tiles`` > 1): deviceless v5p compiles of tierax's step
with a buffer-assignment dump, the live set at XLA's peak beside the cost model's loss term.

Question: what does XLA:TPU hold at the peak of a tiled loss (``loss_tiles`` > 1), beside the cost
model's loss term?  Answered: one tile's logits, the gathered head, the tile's float32 head
gradient and its all-reduce in the compute dtype, the final hidden states and their gradient; the
model's loss term now counts what XLA holds (tests/test_costmodel_hand.py).
Records: bench/results/tpu_tiled_loss.json
Docs: docs/guide/tpu.md

Per case, one ``tierax compile --json`` child whose ``XLA_FLAGS`` add ``--xla_dump_to`` (tierax
appends its own flags to the user's: tierax.launch.flags) and one ``tierax simulate --json`` for the
same model, mesh, shape and plan.  From the dump: the preallocated temp (the heap the step
allocates; with the arguments, the peak XLA:TPU assigns), the live-range report's peak (the bytes
live at the peak instruction, without the heap's fragmentation) and every value of at least
:data:`BIG` bytes live there, with its HLO shape and the JAX operation it came from.  From the
cost model: its assigned peak, its loss-phase peak and its loss term (``logits_bytes``).

Cases (4 loss tiles, splash attention): Llama 3 8B on 8 v5p (fsdp=8, 1 × 8192, plan remat-full:
the layers hold only their inputs, so the loss is at or near the peak); Llama 3.1 405B cut to 2
layers on 512 v5p (fsdp=512, 2 × 8192, remat-full: the head of the holdout's H-3 run, d_model
16384, at a vocabulary 512 does not divide); and the whole H-3 run as bench/published_runs.py
expresses it (126 layers, its offloading plan; MaxText ran it on 512 v5p).  Goal: the model's
assigned peak within 5 % of XLA's (reported either way).  Writes bench/results/tpu_tiled_loss.json.

    .venv/bin/python bench/investigations/tpu_tiled_loss.py [--out FILE] [--case NAME ...]
"""

from __future__ import annotations

import pathlib
import re
import sys
import tempfile

BENCH = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: _common and the benchmarks these read

import _common  # noqa: E402

SCHEMA = "tierax.bench.tpu_tiled_loss/1"
GOAL = 0.05
GIB = 2**30
BIG = 64 * 2**20  # values listed at the peak: at least this many bytes
DOCS_MARKER = "tpu-tiled-loss"
COMMON = ["--target", "v5p", "--set", "attention=splash", "--set", "loss_tiles=4"]
CASES = {
    "llama3-8b fsdp=8 1x8192 remat-full": [
        "--model", "llama3-8b", "--devices", "8", "--mesh", "fsdp=8",
        "--microbatch", "1", "--seq", "8192", "--plan", "remat-full",
    ],
    "llama3.1-405b (2 layers) fsdp=512 2x8192 remat-full": [
        "--model", "llama3.1-405b", "--set", "num_layers=2", "--devices", "512",
        "--mesh", "fsdp=512", "--microbatch", "2", "--seq", "8192", "--plan", "remat-full",
    ],
    # The published H-3 run as bench/published_runs.py expresses it (its plan written by that
    # script's reading of the run's MaxText remat keys).
    "llama3.1-405b fsdp=512 2x8192 H-3's plan": [
        "--model", "llama3.1-405b", "--devices", "512", "--mesh", "fsdp=512",
        "--microbatch", "2", "--seq", "8192", "--plan", "{H-3}",
    ],
}  # fmt: skip


def _published_plan(run_id: str, tmp: str) -> str:
    """The plan bench/published_runs.py predicts the holdout run ``run_id`` with, as a YAML file in
    ``tmp``."""
    import published_runs as pr
    import yaml

    spec = pr.EXPRESS[run_id]
    cfg = pr._config(spec, spec.get("attention", "auto"))
    plan = pr._plan(spec["remat"], cfg, "tpu", run_id)
    path = pathlib.Path(tmp) / f"plan-{run_id}.yaml"
    path.write_text(yaml.safe_dump(plan.to_dict()))
    return str(path)


def _hlo_values(hlo: str) -> dict[str, dict]:
    """HLO instruction name → its shapes (one per tuple element) and the JAX operation (op_name
    metadata) it came from."""
    out = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (.*)$", line)
        if not m:
            continue
        head = re.split(r" [a-z][\w\-]*\(", m.group(2), maxsplit=1)[0]  # the shape, before the op
        op = re.search(r'op_name="([^"]*)"', line)
        out[m.group(1)] = {
            "shapes": re.findall(r"[a-z]\w*\[[\d,]*\]", head),
            "op_name": op.group(1) if op else "",
        }
    return out


def live_at_peak(dump: pathlib.Path, big: int = BIG) -> dict:
    """The step's live-range report in ``dump``: the bytes live at the peak instruction and the
    values of at least ``big`` bytes among them (largest first)."""
    found = sorted(dump.glob("*jit_step*after_optimizations-live-range.txt"))
    if not found:
        raise FileNotFoundError(f"no *jit_step*after_optimizations-live-range.txt in {dump}")
    text = found[-1].read_text()
    total = re.search(r"Stack trace breakdown for peak usage: ([\d ]+) bytes", text)
    start = re.search(r"Live ranges at (\d+) \(peak\):\n", text)
    if total is None or start is None:
        raise ValueError(f"{found[-1].name}: no peak in the live-range report")
    values = []
    for line in text[start.end() :].splitlines():
        m = re.match(r"\s+(\S+?)(\{[\d,]*\})?: (\d+) bytes", line)
        if not m:
            break
        values.append((int(m.group(3)), m.group(1), m.group(2) or ""))
    assigned = _assigned_values(dump)
    hlo_file = sorted(dump.glob("*jit_step*after_optimizations.txt"))
    hlo = _hlo_values(hlo_file[-1].read_text()) if hlo_file else {}
    listed = []
    for b, name, index in sorted(values, reverse=True):
        if b < big:
            continue
        h = hlo.get(name, {"shapes": [], "op_name": ""})
        i = int(index.strip("{}") or 0) if index.strip("{}").isdigit() else 0
        shape = h["shapes"][i] if i < len(h["shapes"]) else ""
        listed.append(
            {
                "value": name + index,
                "bytes": b,
                "shape": shape,
                "op_name": h["op_name"],
                "device": assigned.get(name + (index or "{}"), (0, True))[1],
            }
        )
    return {
        "peak_instruction": int(start.group(1)),
        "live_peak_bytes": int(total.group(1).replace(" ", "")),
        # the report's peak counts every memory space: the device's share of the values live there
        "live_peak_device_bytes": sum(
            b for b, name, index in values if assigned.get(name + (index or "{}"), (0, True))[1]
        ),
        "values": listed,
    }


def _assigned_values(dump: pathlib.Path) -> dict[str, tuple[int, bool]]:
    """Each value of the buffer assignment in ``dump`` (named as the live-range report names it:
    ``name{}``, or ``name{i}`` for a tuple's element) → (its size in bytes, whether it is in the
    device's default memory space; an allocation with a color — pinned host memory for offloaded
    values — is not)."""
    found = sorted(dump.glob("*jit_step*after_optimizations-buffer-assignment.txt"))
    if not found:
        raise FileNotFoundError(f"no *jit_step*after_optimizations-buffer-assignment.txt in {dump}")
    out: dict[str, tuple[int, bool]] = {}
    for block in re.split(r"^(?=allocation \d+:)", found[-1].read_text(), flags=re.M):
        head = block.split("\n", 1)[0]
        device = not re.match(r"allocation \d+: size \d+, color [1-9]", head)
        for name, size in re.findall(r"value: <\d+ ([^ >]+) @\d+> \(size=(\d+),", block):
            out[name if "{" in name else name + "{}"] = (int(size), device)
    return out


def run_case(name: str, args: list[str], tmp: str) -> dict:
    dump = pathlib.Path(tmp) / re.sub(r"\W+", "-", name)
    args = [_published_plan(a[1:-1], tmp) if a.startswith("{") else a for a in args]
    flags = [*args, *COMMON, "--json"]
    compile_cmd = _common.tierax("compile", *flags)
    case, compiled = _common.compile_case(compile_cmd, env=_common.dump_env(dump))
    if compiled is None:
        return case
    b, failed = _common.simulate_breakdown(flags)
    if b is None:
        return failed
    heap = _common.preallocated_temp(dump)["preallocated_temp_bytes"]
    assigned = compiled["device_argument_bytes"] + heap
    live = live_at_peak(dump)
    return {
        "returncode": 0,
        "command": case["command"],
        "compile_wall_s": case["wall_s"],
        "libtpu_version": compiled.get("libtpu_version"),
        "fits": compiled["fits"],
        "xla_reported_peak_bytes": compiled["device_peak_bytes"],
        "xla_argument_bytes": compiled["device_argument_bytes"],
        "xla_preallocated_temp_bytes": heap,
        "xla_assigned_peak_bytes": assigned,
        "xla_live_peak_bytes": live["live_peak_bytes"],
        "xla_live_peak_device_bytes": live["live_peak_device_bytes"],
        "xla_live_values": live["values"],
        "model_assigned_peak_bytes": b["assigned_peak_bytes"],
        "model_loss_phase_bytes": b["loss_phase_bytes"],
        "model_layer_phase_bytes": b["layer_phase_bytes"],
        "model_loss_term_bytes": b["logits_bytes"],
        "model_error_vs_assigned": b["assigned_peak_bytes"] / assigned - 1,
        "model_error_vs_live_device": b["assigned_peak_bytes"] / live["live_peak_device_bytes"] - 1,
    }


def markdown(doc: dict) -> str:
    """The docs table of the record (every figure read from it)."""
    lines = [
        "| case | XLA assigned GiB (arguments + heap) | of it live at the live-range peak GiB "
        "| model GiB "
        "| model error | model's loss term GiB | fits |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    lines += _common.case_rows(
        doc["cases"],
        7,
        lambda name, c: (
            f"| {name} | {c['xla_assigned_peak_bytes'] / GIB:.2f} | "
            f"{c['xla_live_peak_device_bytes'] / GIB:.2f} | "
            f"{c['model_assigned_peak_bytes'] / GIB:.2f} | "
            f"{c['model_error_vs_assigned']:+.1%} | {c['model_loss_term_bytes'] / GIB:.2f} | "
            f"{'yes' if c['fits'] else 'no'} |"
        ),
    )
    libtpu = sorted({str(c.get("libtpu_version")) for c in doc["cases"].values() if "fits" in c})
    lines += [
        "",
        f"`python bench/investigations/tpu_tiled_loss.py`, {doc['created'][:10]}, "
        f"jax {doc['jax_version']}, "
        f"libtpu {', '.join(libtpu)}; {doc['goal']}: {'met' if doc['goal_met'] else 'not met'}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = _common.parser(__doc__, "tpu_tiled_loss.json")
    ap.add_argument("--case", action="append", choices=list(CASES), help="run only these cases")
    _common.add_docs(ap, SCHEMA)
    args = ap.parse_args()
    if args.docs:
        return _common.docs_written(DOCS_MARKER, markdown(args.docs))
    doc = _common.envelope(SCHEMA) | {"goal": f"model assigned peak within {GOAL:.0%}"}
    doc["cases"] = {}
    with tempfile.TemporaryDirectory(prefix="tierax-tiled-loss-") as tmp:
        for name in args.case or CASES:
            c = run_case(name, CASES[name], tmp)
            doc["cases"][name] = c
            if c["returncode"]:
                print(f"{name}: failed: {c['error']}", flush=True)
                continue
            xla, live = c["xla_assigned_peak_bytes"] / GIB, c["xla_live_peak_device_bytes"] / GIB
            model, loss = c["model_assigned_peak_bytes"] / GIB, c["model_loss_term_bytes"] / GIB
            print(
                f"{name}: XLA assigned {xla:.2f} GiB (live {live:.2f}), model {model:.2f} "
                f"({c['model_error_vs_assigned']:+.1%}; loss term {loss:.2f})",
                flush=True,
            )
    done = [c for c in doc["cases"].values() if not c["returncode"]]
    doc["goal_met"] = (
        bool(done)
        and len(done) == len(doc["cases"])
        and all(abs(c["model_error_vs_assigned"]) <= GOAL for c in done)
    )
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    sys.exit(main())
