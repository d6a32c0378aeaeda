#!/usr/bin/env python3
"""FP8 in XLA's program: deviceless compiles of Llama 3 8B for H200, B200 and GB200, bf16 beside
``quantization=fp8`` (per-tensor delayed scaling) and, on the Blackwells, ``quantization=mxfp8``
(block-scaled MXFP8).

Llama 3 8B, 2 × 4096 tokens per device on 8 GPUs (fsdp=8; one GPU does not hold the float32
master weights, AdamW moments and gradients of 8 B parameters), plan ``minimal``: for each target
and quantization, one ``tierax compile --json`` child process, recording XLA's peak, the cost
model's peak for the same plan, whether it fits and which fp8 GEMMs XLA's program holds (counted
as written: a scanned layer's once; tierax.xla.hlo.fp8_gemms): cuBLASLt fp8 calls or dots of fp8
operands for ``fp8``, cuDNN's block-scaled GEMM calls (``__cudnn$blockScaledDot``) for ``mxfp8``.
Goal: fp8 GEMMs present with a quantization and absent without, block-scaled ones with ``mxfp8``
only; the model's peak within 10 % of XLA's for every case.
Writes bench/results/fp8_compile.json.

    .venv/bin/python bench/fp8_compile.py [--out FILE]
    .venv/bin/python bench/fp8_compile.py --docs bench/results/fp8_compile.json   # docs table
"""

from __future__ import annotations

import sys

import _common

GOAL = 0.10
ARGS = [
    "--model", "llama3-8b", "--devices", "8", "--mesh", "fsdp=8",
    "--microbatch", "2", "--seq", "4096", "--plan", "minimal",
]  # fmt: skip
# (target, quantization): MXFP8 on the Blackwells only (Hopper refuses it)
CASES = [
    ("h200", ""), ("h200", "fp8"),
    ("b200", ""), ("b200", "fp8"), ("b200", "mxfp8"),
    ("gb200", ""), ("gb200", "fp8"), ("gb200", "mxfp8"),
]  # fmt: skip


def compile_case(target: str, quantization: str) -> dict:
    quant = ["--set", f"quantization={quantization}"] if quantization else []
    cmd = _common.tierax("compile", *ARGS, "--target", target, *quant, "--json")
    case, r = _common.compile_case(cmd)
    if r is None:
        return case
    return case | {
        "fp8_gemms": r["fp8_gemms"],
        "block_scaled_gemms": r.get("block_scaled_gemms", 0),
        "notes": [n for n in r["notes"] if "fp8" in n],
    }


GIB = 2**30
DOCS_MARKER = "fp8-compile"


def markdown(doc: dict) -> str:
    """The docs table of the record: one row per target and quantization (every figure read from
    it)."""
    lines = [
        "| target / quantization | fp8 GEMMs in XLA's program | of them block-scaled (cuDNN) | "
        "XLA peak GiB | predicted GiB | model error | fits | compile s |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    lines += _common.case_rows(
        doc["cases"],
        8,
        lambda name, c: (
            f"| {name} | {c['fp8_gemms']} | {c.get('block_scaled_gemms', 0)} | "
            f"{c['xla_peak_bytes'] / GIB:.2f} | {c['model_peak_bytes'] / GIB:.2f} | "
            f"{c['model_error']:+.1%} | {'yes' if c['fits'] else 'no'} | "
            f"{c['compile_time_s']:.0f} |"
        ),
    )
    fp8 = doc["cases"].get("h200/fp8", {})
    lines += [
        "",
        f"`tierax {fp8.get('command', '').removeprefix('tierax.cli ')}` (and the same for each "
        f"target and quantization); {_common.made_by(doc)}; goal ({doc['goal']}) met: "
        f"{'yes' if doc['goal_met'] else 'no'}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = _common.parser(__doc__, "fp8_compile.json")
    _common.add_docs(ap, "tierax.bench.fp8_compile/2")
    args = ap.parse_args()
    if args.docs:
        doc = args.docs
        print(f"wrote {_common.write_docs_table(DOCS_MARKER, markdown(doc))}")
        return 0
    cases = {f"{t}/{q or 'none'}": compile_case(t, q) for t, q in CASES}
    ok = all(c["returncode"] == 0 for c in cases.values())
    goal = ok and all(
        (c["fp8_gemms"] > 0) == (not key.endswith("/none"))
        and (c["block_scaled_gemms"] > 0) == key.endswith("/mxfp8")
        and abs(c["model_error"]) <= GOAL
        for key, c in cases.items()
    )
    doc = _common.envelope("tierax.bench.fp8_compile/2") | {
        "goal": f"fp8 GEMMs in XLA's program with quantization=fp8 or mxfp8 only, cuDNN "
        f"block-scaled ones with mxfp8 only; model peak within {GOAL:.0%} of XLA's",
        "goal_met": bool(goal),
        "cases": cases,
    }
    _common.write_record(args.out, doc)
    for name, c in cases.items():
        if c["returncode"]:
            print(f"{name}: failed: {c['error']}", file=sys.stderr)
            continue
        print(
            f"{name}: XLA peak {c['xla_peak_bytes'] / 2**30:.2f} GiB, model "
            f"{c['model_peak_bytes'] / 2**30:.2f} GiB ({c['model_error']:+.1%}), fits "
            f"{c['fits']}, fp8 GEMMs {c['fp8_gemms']} (block-scaled {c['block_scaled_gemms']}), "
            f"compile {c['compile_time_s']:.0f} s"
        )
    return 0 if goal else 1


if __name__ == "__main__":
    sys.exit(main())
