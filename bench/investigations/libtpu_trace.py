#!/usr/bin/env python3
"""What the installed libtpu's ``temp_size_in_bytes`` holds beside its own HLO buffer assignment.

Question: is what libtpu 0.0.42.1's ``temp_size_in_bytes`` counts beyond libtpu 0.0.52's a
buffer of tierax's step?  Answered: no; both libtpus' buffer assignments hold the same buffers and
a heap of the same size, so the excess is a libtpu-keyed term of the cost model
(tierax.costmodel.fixed.libtpu_temp_excess_bytes), not a buffer.
Records: bench/results/libtpu_trace_0.0.42.1.json, bench/results/libtpu_trace_0.0.52.json,
bench/results/libtpu_trace_0.0.42.1_8x4096.json
Docs: docs/guide/tpu.md

For each layer count, ``tierax compile`` of Llama 3 8B on 8 v5p chips (fsdp=8) at microbatch ×
sequence, under the planner's plan for the full model at that shape (planned once, by ``tierax
plan``), in a child process of this interpreter whose ``XLA_FLAGS`` add ``--xla_dump_to`` (tierax
appends its own flags to the user's: tierax.launch.flags).  From XLA:TPU's dump of the step it
reads the buffer assignment's preallocated temp (the default memory space's heap: every temporary
buffer at its offset) and the largest buffers in it; from the compile's JSON, XLA's memory analysis.
The record states, per layer count, ``temp_size_in_bytes`` minus that heap, where
``temp_size_in_bytes`` is the compile JSON's ``device_temp_bytes``: XLA's figure less its host temp
for a libtpu then read as counting the host temp inside it (no longer: the host temp is outside
``temp_size_in_bytes``, bench/results/libtpu_colors_tr1.json; 0 without offloading;
``host_temp_bytes`` states it).  Run it with each
libtpu's interpreter (this checkout on ``PYTHONPATH``); each record names its libtpu.

    python bench/investigations/libtpu_trace.py --out bench/results/libtpu_trace_0.0.42.1.json \
        [--layers 2 4 32]
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile

BENCH = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: _common and the benchmarks these read

import _common  # noqa: E402

ROOT = BENCH.parent
SCHEMA = "tierax.libtpu-trace/1"
SHAPE = ["--target", "v5p", "--devices", "8", "--mesh", "fsdp=8"]
BIG = 512 * 2**20  # buffers listed: at least this many bytes


def _for_layers(plan_yaml: str, layers: int) -> str:
    """The full model's plan with its ``planned_for`` model cut to ``layers`` layers: the CLI
    refuses a plan planned for another model, and this trace compiles the full model's plan at
    fewer layers."""
    import yaml

    from tierax.plan.planned_for import model_name, parse_model_name

    doc = yaml.safe_load(plan_yaml)
    name, overrides = parse_model_name(doc["planned_for"]["model"])
    doc["planned_for"]["model"] = model_name(name, [*overrides, f"num_layers={layers}"])
    return yaml.safe_dump(doc, sort_keys=False)


def main() -> int:
    ap = _common.parser(__doc__, "libtpu_trace.json")
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4, 32], help="num_layers each")
    ap.add_argument("--microbatch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args()
    if any(n < 1 for n in args.layers):
        ap.error("--layers must be at least 1 each")
    versions = _common.versions("jax", "jaxlib", "libtpu")
    if versions["libtpu"] is None:
        sys.exit("libtpu is not installed: pip install 'tierax[tpu-aot]'")
    shape = [*SHAPE, "--microbatch", str(args.microbatch), "--seq", str(args.seq)]
    model = ["--model", "llama3-8b"]
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        plan = pathlib.Path(tmp) / "plan.yaml"
        p = _common.run(
            _common.tierax("plan", *model, *shape, "--out", str(plan), "--json"), cwd=ROOT
        )
        if p.returncode:
            sys.exit(f"tierax plan failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        for layers in args.layers:
            dump = pathlib.Path(tmp) / f"dump-{layers}"
            env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text"}
            cut = pathlib.Path(tmp) / f"plan-{layers}.yaml"
            cut.write_text(_for_layers(plan.read_text(), layers))
            cmd = ["compile", *model, "--set", f"num_layers={layers}", *shape, "--plan", str(cut)]
            c = _common.run(_common.tierax(*cmd, "--json"), timeout=3600, cwd=ROOT, env=env)
            if c.returncode:
                sys.exit(
                    f"tierax {' '.join(cmd)} failed (exit {c.returncode}):\n{c.stderr[-3000:]}"
                )
            r = json.loads(c.stdout)
            heap = _common.preallocated_temp(dump, BIG)
            cases.append(
                {
                    "num_layers": layers,
                    "command": " ".join(["tierax", *cmd, "--json"]) + "  (XLA_FLAGS=--xla_dump_to)",
                    "temp_size_in_bytes": r["device_temp_bytes"],
                    "preallocated_temp_bytes": heap["preallocated_temp_bytes"],
                    "temp_over_buffer_assignment_bytes": r["device_temp_bytes"]
                    - heap["preallocated_temp_bytes"],
                    "host_temp_bytes": r["host_temp_bytes"],
                    "device_peak_bytes": r["device_peak_bytes"],
                    "device_argument_bytes": r["device_argument_bytes"],
                    "predicted_peak_bytes": r["predicted"]["peak_device_bytes"],
                    "compile_time_s": round(r["compile_time_s"], 1),
                    "largest_buffers": heap["buffers"][:12],
                }
            )
            print(json.dumps({k: v for k, v in cases[-1].items() if k != "largest_buffers"}))
        doc = _common.envelope(SCHEMA) | {
            "versions": versions,
            "configuration": " ".join([*model, *shape]),
            "plan_yaml": plan.read_text(),
            "cases": cases,
        }
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    sys.exit(main())
