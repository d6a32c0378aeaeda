#!/usr/bin/env python3
"""``tierax compile --maxtext`` beside MaxText's own ahead-of-time compiler, per case.

Each case is a MaxText 0.2.5 model (its own model file, layers cut to keep a compile to about a
minute on 2 cores; every other key as the file ships it) at a per-device batch and sequence on a
target.  For a TPU target both sides compile MaxText's step deviceless for the same slice:
``python -m maxtext.trainers.pre_train.train_compile ... compile_topology=SLICE`` prints
``CompiledMemoryStats``, and ``tierax compile --maxtext ... --json`` reads its own compile; the
record keeps both and whether arguments, temp, alias and host temp are equal.  For a GPU target
MaxText's own compiler needs GPUs, so only tierax's reading is recorded (MaxText's mesh over
tierax's compile-only GPU devices; the attention it compiled named).

    python bench/maxtext_compile.py [--cases NAME,...] [--out bench/results/maxtext_compile.json]
    python bench/maxtext_compile.py --docs bench/results/maxtext_compile.json

Runs for ~10-20 minutes on 2 shared cores (one child process per compile).
"""

from __future__ import annotations

import re
import sys
import tempfile

import _common
import _maxtext

SCHEMA = "tierax.bench.maxtext_compile/1"
MARKER = "maxtext-compile"
# (name, model, target, devices, per-device batch, sequence, extra MaxText keys)
CASES = [
    ("llama3-8b-v5p-full", "llama3-8b", "v5p", 4, 1, 2048, ["remat_policy=full"]),
    ("llama3-8b-v5p-qkv-offload", "llama3-8b", "v5p", 4, 1, 2048,
     ["remat_policy=qkv_proj_offloaded"]),  # fmt: skip
    ("mistral-7b-v6e-minimal", "mistral-7b", "v6e", 4, 1, 2048, ["remat_policy=minimal"]),
    ("qwen3-8b-v6e-full", "qwen3-8b", "v6e", 4, 1, 2048, ["remat_policy=full"]),
    ("llama3-8b-h200-full", "llama3-8b", "h200", 4, 1, 2048, ["remat_policy=full"]),
    ("mixtral-8x7b-h200-full", "mixtral-8x7b", "h200", 4, 1, 2048, ["remat_policy=full"]),
]
LAYERS = 2  # base_num_decoder_layers for every case (the state and per-layer buffers scale)
SLICE = {"v5p": "v5p", "v6e": "v6e", "v5e": "v5e", "v7x": "tpu7x"}
FIELDS = {  # CompiledMemoryStats field → tierax compile JSON field
    "argument_size_in_bytes": "device_argument_bytes",
    "temp_size_in_bytes": "device_temp_bytes",
    "alias_size_in_bytes": "device_alias_bytes",
    "host_temp_size_in_bytes": "host_temp_bytes",
}








def _slice_name(target: str, devices: int) -> str:
    from maxtext.utils.accelerator_to_spec_map import UserFacingNameToSystemCharacteristics as U

    prefix = SLICE[target]
    return next(
        n for n, s in U.items() if n.rpartition("-")[0] == prefix and s.devices_per_slice == devices
    )


def maxtext_side(keys: list[str], target: str, devices: int, env: dict | None = None) -> dict:
    """MaxText's own train_compile of ``keys`` for the slice: its printed memory figures (``env``:
    the child's environment, default :func:`_maxtext.env`)."""
    with tempfile.TemporaryDirectory(prefix="tierax-bench-mt-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "maxtext.trainers.pre_train.train_compile",
            _maxtext.base_yml(),
            "run_name=bench",
            f"base_output_directory={tmp}",
            f"jax_cache_dir={tmp}/cache",
            "dataset_type=synthetic",
            "enable_checkpointing=false",
            "skip_jax_distributed_system=true",
            f"compile_topology={_slice_name(target, devices)}",
            "compile_topology_num_slices=1",
            *keys,
        ]
        proc = _common.run(cmd, timeout=3600, env=_maxtext.env() if env is None else env)
    text = proc.stdout + proc.stderr
    stats = re.search(r"Memory analysis: CompiledMemoryStats\((.*)\)", text)
    out = {"command": " ".join(cmd[3:]), "returncode": proc.returncode, "wall_s": proc.wall_s}
    if stats is None:
        oom = re.search(r"(CompileTimeHbmOom.*|RESOURCE_EXHAUSTED.*)", text)
        return out | {"error": (oom.group(1) if oom else text.strip().splitlines()[-1])[:500]}
    return out | {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", stats.group(1))}


def tierax_side(keys: list[str], target: str, devices: int) -> dict:
    import json

    # MaxText's train_compile beside it adds its own libtpu options only: so does this compile
    # (without --maxtext-flags-only it adds the flags tierax models, a program train_compile
    # compiles where the environment sets them)
    cmd = _common.tierax(
        "compile", "--maxtext", _maxtext.base_yml(), *keys, "--target", target,
        "--devices", str(devices), "--maxtext-flags-only", "--json",
    )  # fmt: skip
    proc = _common.run(cmd, timeout=3600, env=_maxtext.env())
    out = {"command": " ".join(cmd[2:]), "returncode": proc.returncode, "wall_s": proc.wall_s}
    if proc.returncode != 0:
        return out | {"error": proc.stderr.strip().splitlines()[-1:]}
    r = json.loads(proc.stdout[proc.stdout.index("{") :])
    keep = ("fits", "device_peak_bytes", "attention", "cudnn_calls", "cudnn_workspace_bytes",
            "compile_time_s", "mesh", "notes", "libtpu_version", *FIELDS.values())  # fmt: skip
    return out | {k: r[k] for k in keep} | {"transfers": r["overlap"].get("transfers", 0)}


def run_case(name, model, target, devices, batch, seq, extra) -> dict:
    keys = _maxtext.keys(model, LAYERS, batch, seq, extra)
    case = {"name": name, "model": model, "target": target, "devices": devices,
            "per_device_batch_size": batch, "seq": seq, "keys": keys}  # fmt: skip
    case["tierax"] = tierax_side(keys, target, devices)
    if target in SLICE:
        mt = maxtext_side(keys, target, devices)
        case["maxtext_train_compile"] = mt
        if "error" not in mt and "error" not in case["tierax"]:
            case["equal"] = {f: mt[f] == case["tierax"][t] for f, t in FIELDS.items()}
    return case


def render(doc: dict) -> str:
    gib = 2**30
    lines = [
        "| case | target | tierax: args / temp / host temp (GiB) | MaxText train_compile: "
        "args / temp / host temp (GiB) | equal |",
        "|---|---|---|---|---|",
    ]
    for c in doc["cases"]:
        t = c["tierax"]
        ours = (
            " / ".join(f"{t[f] / gib:.3f}" for f in FIELDS.values() if f != "device_alias_bytes")
            if "error" not in t
            else f"error: {t['error']}"
        )
        mt = c.get("maxtext_train_compile")
        if mt is None:
            theirs, equal = "— (needs GPUs)", "—"
        elif "error" in mt:
            theirs, equal = f"error: {mt['error'][:80]}", "—"
        else:
            theirs = " / ".join(
                f"{mt[f] / gib:.3f}" for f in FIELDS if f != "alias_size_in_bytes"
            )
            equal = "yes" if all(c.get("equal", {}).values()) else "no"
        where = f"{c['target']} × {c['devices']}"
        lines.append(f"| {c['name']} | {where} | {ours} | {theirs} | {equal} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    return _maxtext.run_cases(
        argv,
        doc=__doc__,
        out="maxtext_compile.json",
        schema=SCHEMA,
        marker=MARKER,
        cases=CASES,
        run_case=run_case,
        render=render,
        fields={"layers": LAYERS},
    )


if __name__ == "__main__":
    sys.exit(main())
