#!/usr/bin/env python3
"""Where XLA:TPU schedules a step's host copies: deviceless v5e compiles of the 0.63 B dense case
of the chip check under offload plans at several microbatches, each host store and load with the
work XLA put between its start and its done, beside the compiled peak.

Question: why did the planner's offload plans run 23–35 % slower on the v5e chip than predicted
(bench/results/tpu_check.json), when qkv-offload ran as predicted?  Answered from XLA's own
schedule: (1) a store issued in its own layer ends in that loop iteration, so a value produced late
(the MLP's up-projection) hid under one matmul — tierax's prefetching scan now stores a layer's
values while the next layer computes; (2) where the step's peak is near the limit, XLA:TPU's
scheduler issues each backward load where it is consumed (nothing between start and done), the
prefetch serialized: the planners' plans peaked there, qkv-offload did not.
Records: bench/results/tpu_copy_schedule.json
Docs: docs/concepts/mechanisms.md

    python bench/investigations/tpu_copy_schedule.py            # ~1 minute a compile, CPU only
    python bench/investigations/tpu_copy_schedule.py --quick    # one case
"""

from __future__ import annotations

import pathlib
import re
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import _common  # noqa: E402 — it imports tierax, found through src
import tpu_check  # noqa: E402 — the chip check's cases

SCHEMA = "tierax.tpu-copy-schedule/1"
# the chip check's dense model, its attention named (a deviceless compile takes no "auto")
DENSE = [
    "attention=splash" if o == "attention=auto" else o
    for o in next(c[2] for c in tpu_check.CASES if c[0] == "dense")
]
KEEP_MLP = {  # the chip check's second planned plan: the MLP's up-projection offloaded
    "decoder_layer_input": "device",
    "query_proj": "device",
    "key_proj": "device",
    "value_proj": "remat",
    "attention_out": "remat",
    "out_proj": "device",
    "mlpwi_0": "device",
    "mlpwi_1": "offload",
    "mlpwo": "device",
}
# (plan, microbatch): a preset's name or a placements dict
CASES = (
    ("qkv-offload", 8),
    ("qkv-offload", 16),
    ("mlpwi_1-offload", 4),
    ("mlpwi_1-offload", 7),
    ("mlpwi_1-offload", 8),
)
_PAIR = re.compile(r"\s*%([\w.-]+) = (.*?) (dynamic-slice-start|dynamic-update-slice-start)\(")


def host_copies(text: str) -> list[dict]:
    """Each host (S(5)) dynamic-slice / dynamic-update-slice start in a while body, with the
    instructions and the matmul fusions or kernels XLA scheduled before its done."""
    out = []
    for comp in re.split(r"\n(?=%|ENTRY)", text):
        head = comp.split("\n", 1)[0]
        lines = [ln for ln in comp.split("\n")[1:] if ln.startswith(("  %", "  ROOT"))]
        for i, line in enumerate(lines):
            m = _PAIR.match(line)
            if not m or "S(5)" not in m.group(2):
                continue
            done = re.compile(r"-done\(%" + re.escape(m.group(1)) + r"\)")
            j = next((k for k in range(i + 1, len(lines)) if done.search(lines[k])), None)
            if j is None:
                continue
            between = lines[i + 1 : j]
            out.append(
                {
                    "computation": head.split(" ")[0].lstrip("%"),
                    "direction": "d2h" if "update" in m.group(3) else "h2d",
                    "instructions_between": len(between),
                    "matmuls_or_kernels_between": sum(
                        "kind=kOutput" in b or 'custom_call_target="tpu_custom_call"' in b
                        for b in between
                    ),
                }
            )
    return out


def compile_case(cfg, plan_name: str, mb: int) -> dict:
    from tierax.plan.presets import load_plan
    from tierax.plan.types import Plan
    from tierax.xla.compile import compile_for_target

    if plan_name in ("qkv-offload",):
        plan = load_plan(plan_name, cfg)
    else:
        plan = Plan.from_dict(
            {"plan": plan_name, "groups": {"decoder": {"default": "remat", **KEEP_MLP}}}
        )
    t0 = time.perf_counter()
    res, text = compile_for_target(cfg, plan, "v5e", microbatch=mb, seq=2048)
    d = res.to_json()
    copies = [c for c in host_copies(text) if c["computation"].startswith("wide.region")]
    return {
        "plan": plan_name,
        "microbatch": mb,
        "compile_s": time.perf_counter() - t0,
        "device_peak_bytes": d.get("device_peak_bytes"),
        "device_limit_bytes": d.get("device_limit_bytes"),
        "host_temp_bytes": d.get("host_temp_bytes"),
        "loop_copies": copies,
        "loads_serialized": any(
            c["direction"] == "h2d" and c["instructions_between"] == 0 for c in copies
        ),
    }


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "tpu_copy_schedule.json")
    _common.add_quick(ap, "one case (mlpwi_1-offload at microbatch 8)")
    args = ap.parse_args(argv)
    from tierax import launch

    launch.start_deviceless_tpu(accelerator_type="v5litepod-1")
    from tierax.models import apply_overrides, get_config

    cfg = apply_overrides(get_config("tiny-llama"), DENSE)
    doc = _common.envelope(SCHEMA, argv)
    doc["model"] = {"base": "tiny-llama", "overrides": DENSE, "seq": 2048, "target": "v5e"}
    doc["cases"] = []
    for plan_name, mb in CASES[-1:] if args.quick else CASES:
        case = compile_case(cfg, plan_name, mb)
        doc["cases"].append(case)
        print(
            f"{plan_name} mb {mb}: peak {case['device_peak_bytes'] / 2**30:.2f} GiB, host "
            f"{case['host_temp_bytes'] / 2**30:.2f} GiB, loads serialized: "
            f"{case['loads_serialized']}",
            flush=True,
        )
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    raise SystemExit(main())
