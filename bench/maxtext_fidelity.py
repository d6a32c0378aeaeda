#!/usr/bin/env python3
"""tierax's predicted peak of MaxText's own program beside MaxText's compile of it, per case.

Each case is a MaxText 0.2.5 model file (layers cut to ``base_num_decoder_layers=2`` with MaxText's
``override_model_config=true``, every other key as the file ships it; a case named ``...-<n>L`` cut
to n layers, to show what grows with depth) at a per-device batch and sequence on a target, under
one of MaxText's ``remat_policy`` values.  Two children per case:

* ``tierax simulate --maxtext BASE.yml model_name=... --target T --devices N --json``: the cost
  model's prediction of MaxText's program (:func:`tierax.interop.maxtext_program.program`) under
  MaxText's own remat policy;
* ``tierax compile --maxtext ... --json``: MaxText's own train step compiled deviceless (TPU: for
  MaxText's topology, the figures its ``train_compile`` prints; GPU: MaxText's mesh over
  compile-only devices, cuDNN's backward workspace added from shapes).

The record keeps both peaks (arguments + outputs + temp − aliased), the relative error and the host
bytes both sides.  The compiles are the slow part (about a minute or two each on 2 shared cores);
``--reuse RECORD`` takes a case's compile from an earlier record where its command is the same, so
the prediction side can be rerun alone after a change to the model.

    python bench/maxtext_fidelity.py [--cases NAME,...] [--reuse RECORD.json]
        [--dump-dir DIR] [--out bench/results/maxtext_fidelity.json]
    python bench/maxtext_fidelity.py --docs bench/results/maxtext_fidelity.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import _common
import _maxtext

SCHEMA = "tierax.bench.maxtext_fidelity/1"
MARKER = "maxtext-fidelity"
TOLERANCE = 0.05  # the bound on the peak's relative error
HOST_TOLERANCE = 0.01  # and on the host bytes'
LAYERS = 2  # base_num_decoder_layers for a case that names no other
_OFF = ["remat_policy=custom", "query_proj=offload", "key_proj=offload", "value_proj=offload"]
# (name, MaxText model, target, devices, per-device batch, sequence, extra MaxText keys[, layers])
CASES = [
    ("llama3-8b-v5p-full", "llama3-8b", "v5p", 4, 1, 1024, ["remat_policy=full"]),
    ("llama3-8b-v5p-minimal", "llama3-8b", "v5p", 4, 1, 1024, ["remat_policy=minimal"]),
    ("llama3-8b-v5p-qkv-offloaded", "llama3-8b", "v5p", 4, 1, 1024,
     ["remat_policy=qkv_proj_offloaded"]),
    ("llama3-8b-v5p-full-tiled", "llama3-8b", "v5p", 4, 1, 2048,
     ["remat_policy=full", "num_vocab_tiling=4"]),
    ("llama3-8b-h200-full", "llama3-8b", "h200", 4, 1, 1024, ["remat_policy=full"]),
    ("llama3-8b-h200-qkv-offloaded", "llama3-8b", "h200", 4, 1, 1024,
     ["remat_policy=qkv_proj_offloaded"]),
    ("mistral-7b-v6e-minimal", "mistral-7b", "v6e", 4, 1, 2048, ["remat_policy=minimal"]),
    ("mistral-7b-v5p-custom", "mistral-7b", "v5p", 4, 1, 1024, [*_OFF, "mlpwo=device"]),
    ("qwen3-8b-v6e-full", "qwen3-8b", "v6e", 4, 1, 1024, ["remat_policy=full"]),
    ("qwen3-8b-v5p-minimal-tiled", "qwen3-8b", "v5p", 4, 1, 1024,
     ["remat_policy=minimal", "num_vocab_tiling=4"]),
    ("qwen3-8b-h200-minimal", "qwen3-8b", "h200", 4, 1, 1024, ["remat_policy=minimal"]),
    ("llama2-7b-v6e-full", "llama2-7b", "v6e", 4, 2, 1024, ["remat_policy=full"]),
    ("gemma3-4b-v5p-full", "gemma3-4b", "v5p", 4, 1, 1024, ["remat_policy=full"]),
    ("gemma3-4b-v6e-minimal", "gemma3-4b", "v6e", 4, 1, 1024, ["remat_policy=minimal"]),
    ("mixtral-8x7b-v5p-full", "mixtral-8x7b", "v5p", 4, 1, 1024, ["remat_policy=full"]),
    ("mixtral-8x7b-h200-full", "mixtral-8x7b", "h200", 4, 1, 1024, ["remat_policy=full"]),
    ("mixtral-8x7b-v6e-qkv-offloaded", "mixtral-8x7b", "v6e", 4, 1, 1024,
     ["remat_policy=qkv_proj_offloaded"]),
    ("qwen3-30b-a3b-v5p-full", "qwen3-30b-a3b", "v5p", 4, 1, 1024, ["remat_policy=full"]),
    ("qwen3-30b-a3b-v6e-minimal", "qwen3-30b-a3b", "v6e", 4, 1, 1024, ["remat_policy=minimal"]),
    ("deepseek2-16b-v5p-full", "deepseek2-16b", "v5p", 4, 1, 1024, ["remat_policy=full"]),
    # MLA's q/k head dim 192 is above cuDNN flash attention's limit (MaxText's GPU compile and
    # tierax's trace refuse it alike): the attention MaxText runs there
    ("deepseek2-16b-h200-full-dot", "deepseek2-16b", "h200", 4, 1, 1024,
     ["remat_policy=full", "attention=dot_product"]),
    ("gpt-oss-20b-v5p-full", "gpt-oss-20b", "v5p", 4, 1, 1024, ["remat_policy=full"]),
    ("gpt-oss-20b-v6e-custom", "gpt-oss-20b", "v6e", 4, 1, 1024, _OFF),
    ("llama3-8b-v7x-full", "llama3-8b", "v7x", 8, 1, 1024, ["remat_policy=full"]),
    ("llama3-8b-v5p-qkv-offloaded-8L", "llama3-8b", "v5p", 4, 1, 1024,
     ["remat_policy=qkv_proj_offloaded"], 8),
    ("llama3-8b-h200-full-8L", "llama3-8b", "h200", 4, 1, 1024, ["remat_policy=full"], 8),
    # Every layer scan looping (the 2-layer cuts above run one trip of GPT-OSS's two-layer block
    # and of DeepSeek's stacks, which XLA inlines) and, under host offload on a TPU, three trips
    # or more (XLA:TPU unrolls a two-trip loop there: interop/maxtext_program/tpu_offload.py)
    ("llama3-8b-v5p-qkv-offloaded-3L", "llama3-8b", "v5p", 4, 1, 1024,
     ["remat_policy=qkv_proj_offloaded"], 3),
    ("mistral-7b-v5p-custom-3L", "mistral-7b", "v5p", 4, 1, 1024, [*_OFF, "mlpwo=device"], 3),
    ("mixtral-8x7b-v6e-qkv-offloaded-3L", "mixtral-8x7b", "v6e", 4, 1, 1024,
     ["remat_policy=qkv_proj_offloaded"], 3),
    ("gpt-oss-20b-v5p-full-4L", "gpt-oss-20b", "v5p", 4, 1, 1024, ["remat_policy=full"], 4),
    ("gpt-oss-20b-v6e-custom-6L", "gpt-oss-20b", "v6e", 4, 1, 1024, _OFF, 6),
    ("deepseek2-16b-v5p-full-3L", "deepseek2-16b", "v5p", 4, 1, 1024, ["remat_policy=full"], 3),
    ("deepseek2-16b-h200-full-dot-3L", "deepseek2-16b", "h200", 4, 1, 1024,
     ["remat_policy=full", "attention=dot_product"], 3),
    # Gemma 3 scans blocks of its six-layer attention pattern: two trips (2 layers are none)
    ("gemma3-4b-v5p-full-12L", "gemma3-4b", "v5p", 4, 1, 1024, ["remat_policy=full"], 12),
    ("gemma3-4b-v6e-minimal-12L", "gemma3-4b", "v6e", 4, 1, 1024, ["remat_policy=minimal"], 12),
]  # fmt: skip


def _child(verb: str, keys: list[str], target: str, devices: int, dump=None) -> dict:
    cmd = _common.tierax(
        verb, "--maxtext", _maxtext.base_yml(), *keys, "--target", target,
        "--devices", str(devices),
        "--json",
    )  # fmt: skip
    proc = _common.run(cmd, timeout=3600, env=_maxtext.env(dump))
    out = {"command": "tierax " + " ".join(cmd[3:]), "returncode": proc.returncode}
    out["wall_s"] = proc.wall_s
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        # the error's own line (JAX's traceback note comes after some)
        named = [ln for ln in lines if "Error" in ln or "error:" in ln] or lines[-1:]
        return out | {"error": named[-1][:600]}
    return out | {
        "json": json.loads(
            proc.stdout[proc.stdout.index("\n{") + 1 :]
            if not proc.stdout.startswith("{")
            else proc.stdout
        )
    }


def compile_side(keys, target, devices, dump=None) -> dict:
    r = _child("compile", keys, target, devices, dump)
    if "json" not in r:
        return r
    j = r.pop("json")
    keep = ("fits", "device_peak_bytes", "device_argument_bytes", "device_temp_bytes",
            "device_output_bytes", "device_alias_bytes", "host_temp_bytes", "attention",
            "cudnn_calls", "cudnn_workspace_bytes", "tpu_custom_calls", "compile_time_s",
            "libtpu_version", "out_of_memory", "xla_error")  # fmt: skip
    return r | {k: j.get(k) for k in keep}


def simulate_side(keys, target, devices) -> dict:
    r = _child("simulate", keys, target, devices)
    if "json" not in r:
        return r
    j = r.pop("json")
    b = j["breakdown"]
    keep = ("state_bytes", "activation_bytes", "activation_host_bytes", "staging_bytes",
            "workspace_bytes", "logits_bytes", "stack_copy_bytes", "peak_phase",
            "layer_phase_bytes", "loss_phase_bytes")  # fmt: skip
    return r | {
        "peak_device_bytes": j["peak_device_bytes"],
        "host_bytes": j["host_bytes"],
        "step_time_s": j["step_time_s"],
        "fits": j["fits"],
        "breakdown": {k: b.get(k) for k in keep},
    }


def compare(case: dict) -> None:
    """The case's relative errors (prediction − compile) ÷ compile, peak and host."""
    c, s = case.get("compile", {}), case.get("simulate", {})
    if "error" in c or "error" in s or c.get("out_of_memory") or not c or not s:
        return
    xla, ours = c["device_peak_bytes"], s["peak_device_bytes"]
    case["peak_error"] = (ours - xla) / xla
    xh, oh = c.get("host_temp_bytes") or 0, s["host_bytes"]
    case["host_error"] = 0.0 if xh == oh else (oh - xh) / max(xh, 1)
    case["within"] = abs(case["peak_error"]) <= TOLERANCE and (
        xh == oh or abs(case["host_error"]) <= HOST_TOLERANCE
    )


def render(doc: dict) -> str:
    gib = 2**30
    lines = [
        "| case | target × devices | remat / tiling | tierax predicted peak (GiB) | MaxText's "
        "compile peak (GiB) | error | host: tierax / compile (GiB) | within 5 % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cases"]:
        extra = " ".join(k for k in c["keys"][5:])
        s, x = c.get("simulate", {}), c.get("compile", {})
        ours = f"{s['peak_device_bytes'] / gib:.3f}" if "peak_device_bytes" in s else (
            f"error: {s.get('error', '—')[:120]}")  # fmt: skip
        if x.get("out_of_memory"):
            theirs = "refused (out of memory)"
        else:
            theirs = f"{x['device_peak_bytes'] / gib:.3f}" if x.get("device_peak_bytes") else (
                f"error: {x.get('error', '—')[:120]}")  # fmt: skip
        err = f"{c['peak_error']:+.1%}" if "peak_error" in c else "—"
        host = (
            f"{s['host_bytes'] / gib:.3f} / {(x.get('host_temp_bytes') or 0) / gib:.3f}"
            if "host_bytes" in s and "error" not in x
            else "—"
        )
        within = {True: "yes", False: "NO"}.get(c.get("within"), "—")
        lines.append(
            f"| {c['name']} | {c['target']} × {c['devices']} | {extra} | {ours} | {theirs} | "
            f"{err} | {host} | {within} |"
        )
    rows = [c for c in doc["cases"] if "within" in c]
    lines.append("")
    lines.append(
        f"{sum(c['within'] for c in rows)} of {len(rows)} compared cases within "
        f"{TOLERANCE:.0%} (peak) and {HOST_TOLERANCE:.0%} (host); "
        f"{len(doc['cases']) - len(rows)} not compared (an error on either side). "
        f"Model files cut to {doc['layers']} decoder layers (a case named -<n>L: n); command: "
        f"`{doc['command']}`."
    )
    return "\n".join(lines)


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--reuse",
        action="append",
        default=[],
        help="an earlier record whose compiles (same command) are reused (repeatable)",
    )
    ap.add_argument("--dump-dir", help="keep each compile's XLA dump under DIR/<case>")


def _bind(args: argparse.Namespace, ap: argparse.ArgumentParser):
    """The case runner under ``--reuse`` (its records read first, a missing one refused) and
    ``--dump-dir``."""
    earlier = {}
    for path in args.reuse:
        if not pathlib.Path(path).is_file():
            ap.error(f"--reuse {path}: no such record")
        for c in json.loads(pathlib.Path(path).read_text())["cases"]:
            if "compile" in c and "error" not in c["compile"]:
                earlier[c["compile"]["command"]] = c["compile"]

    def run_case(name, model, target, devices, batch, seq, extra, *depth) -> dict:
        layers = depth[0] if depth else LAYERS
        keys = _maxtext.keys(model, layers, batch, seq, extra)
        case = {"name": name, "model": model, "target": target, "devices": devices,
                "layers": layers, "per_device_batch_size": batch, "seq": seq,
                "keys": keys}  # fmt: skip
        case["simulate"] = simulate_side(keys, target, devices)
        command = _child_command("compile", keys, target, devices)
        if command in earlier:
            case["compile"] = earlier[command] | {"reused": True}
        else:
            dump = pathlib.Path(args.dump_dir) / name if args.dump_dir else None
            case["compile"] = compile_side(keys, target, devices, dump)
        compare(case)
        return case

    return run_case


def main(argv=None) -> int:
    return _maxtext.run_cases(
        argv,
        doc=__doc__,
        out="maxtext_fidelity.json",
        schema=SCHEMA,
        marker=MARKER,
        cases=CASES,
        run_case=None,
        render=render,
        fields={"layers": LAYERS, "tolerance": TOLERANCE, "host_tolerance": HOST_TOLERANCE},
        add_args=_options,
        bind=_bind,
    )


def _child_command(verb, keys, target, devices) -> str:
    cmd = _common.tierax(
        verb, "--maxtext", _maxtext.base_yml(), *keys, "--target", target,
        "--devices", str(devices),
        "--json",
    )  # fmt: skip
    return "tierax " + " ".join(cmd[3:])


if __name__ == "__main__":
    sys.exit(main())
