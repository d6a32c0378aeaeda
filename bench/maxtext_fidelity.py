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
    # What decides whether an unrolled 2-layer step's last layer's own host buffers meet its stacks
    # (interop/maxtext_program/tpu_offload.py): the policy swapped between llama3-8b and mistral-7b
    # (the same layer), and mistral-7b at llama3-8b's vocabulary
    ("llama3-8b-v5p-custom", "llama3-8b", "v5p", 4, 1, 1024, [*_OFF, "mlpwo=device"]),
    ("mistral-7b-v5p-qkv-offloaded", "mistral-7b", "v5p", 4, 1, 1024,
     ["remat_policy=qkv_proj_offloaded"]),
    ("mistral-7b-v5p-qkv-offloaded-v128k", "mistral-7b", "v5p", 4, 1, 1024,
     ["remat_policy=qkv_proj_offloaded", "vocab_size=128256"]),
]  # fmt: skip
# Held out: cases added after the rules above were read (no rule was read from their compiles), each
# (name, model, target, devices, per-device batch, sequence, extra MaxText keys, layers, tierax's
# --plan or None); layers None: the model file's own depth.  Full depth at 8,192 tokens on 8
# devices; three families no seen case has (Gemma 2's scanned pair of layers, OLMo 3's and
# Llama 4's four-layer blocks), cut as issue 69's trial cut them, under a keep-all plan, remat
# full and a q/k/v offload.
_L4 = ["ici_fsdp_parallelism=4", "ici_expert_parallelism=2"]
HELD_OUT = [
    ("gemma2-2b-v5e-save-all", "gemma2-2b", "v5e", 4, 2, 1024, [], 2, "save-all"),
    ("gemma2-2b-v5e-full", "gemma2-2b", "v5e", 4, 2, 1024, ["remat_policy=full"], 2, None),
    ("gemma2-2b-v5e-qkv-offload", "gemma2-2b", "v5e", 4, 2, 1024, [], 2, "qkv-offload"),
    ("olmo3-7b-v6e-save-all-4L", "olmo3-7b", "v6e", 4, 1, 1024, [], 4, "save-all"),
    ("olmo3-7b-v6e-full-4L", "olmo3-7b", "v6e", 4, 1, 1024, ["remat_policy=full"], 4, None),
    ("olmo3-7b-v6e-qkv-offload-4L", "olmo3-7b", "v6e", 4, 1, 1024, [], 4, "qkv-offload"),
    # the config's remat_policy, full (base.yml's; the model file sets none): issue 69's case
    ("llama4-17b-16e-v5p-4L", "llama4-17b-16e", "v5p", 8, 1, 1024, _L4, 4, None),
    ("llama4-17b-16e-v5p-qkv-offload-4L", "llama4-17b-16e", "v5p", 8, 1, 1024, _L4, 4,
     "qkv-offload"),
    # the cuts above run one trip of their scan (Gemma 2's two pairs unrolled under offload on a
    # TPU, OLMo 3's and Llama 4's one four-layer block): the same families where the scan loops
    ("gemma2-2b-v5e-qkv-offload-3L", "gemma2-2b", "v5e", 4, 2, 1024, [], 3, "qkv-offload"),
    ("olmo3-7b-v6e-full-8L", "olmo3-7b", "v6e", 4, 1, 1024, ["remat_policy=full"], 8, None),
    ("llama3-8b-v5p-full-32L-8k", "llama3-8b", "v5p", 8, 4, 8192, ["remat_policy=full"], None,
     None),
    ("mistral-7b-v5p-custom-32L-8k", "mistral-7b", "v5p", 8, 2, 8192, [*_OFF, "mlpwo=device"],
     None, None),
    ("qwen3-8b-v6e-full-36L-8k", "qwen3-8b", "v6e", 8, 1, 8192, ["remat_policy=full"], None,
     None),
    ("llama2-7b-v7x-minimal-32L-8k", "llama2-7b", "v7x", 8, 1, 8192, ["remat_policy=minimal"],
     None, None),
    ("qwen3-30b-a3b-v5p-full-48L-8k", "qwen3-30b-a3b", "v5p", 8, 1, 8192, ["remat_policy=full"],
     None, None),
    # added after tpu_terms' rule of a tied table gathered before the forward on v5e (read from
    # the gemma2-2b rows): a larger Gemma 2 under it
    ("gemma2-9b-v5e-full", "gemma2-9b", "v5e", 4, 2, 1024, ["remat_policy=full"], 2, None),
    # added after tpu_terms' reading of which side of the layers' backward loop XLA:TPU makes an
    # untied head's gradient on (read from four full-depth rows above and cut compiles): llama3-8b
    # on v6e at 8192 tokens, 2 x emb (after the loop; the reading before: at the loss), mistral-7b
    # on v5p at 8192 (at the loss), llama3-8b's q/k/v offload on v5p at 2 x 8192 (after the loop,
    # where without the offload it would be at the loss)
    ("llama3-8b-v6e-full-32L-8k", "llama3-8b", "v6e", 8, 1, 8192, ["remat_policy=full"], None,
     None),
    ("mistral-7b-v5p-full-32L-8k", "mistral-7b", "v5p", 8, 1, 8192, ["remat_policy=full"], None,
     None),
    ("llama3-8b-v5p-qkv-offloaded-32L-8k", "llama3-8b", "v5p", 8, 2, 8192,
     ["remat_policy=qkv_proj_offloaded"], None, None),
    # added after the v6e reading by the decoder's query and key norms (read from the llama3-8b
    # v6e row above and 2-layer cuts): the same model at 2 x 8192 tokens, where the reading
    # before held the head's gradient unsharded (tokens >= 3 x emb) and this one its shard
    ("llama3-8b-v6e-full-32L-2x8k", "llama3-8b", "v6e", 8, 2, 8192, ["remat_policy=full"], None,
     None),
]  # fmt: skip
# Cases added as held out whose compiles a rule was then read from: reported as seen (the rule's
# module names the case).
READ_FROM = {
    "llama3-8b-v5p-full-32L-8k": "interop/maxtext_program/tpu_terms.py: the untied loss's two "
    "logits-sized buffers before the head's gradient is made at the loss; which side of the "
    "layers' backward an untied head's gradient is made on (v5p, at the loss)",
    "qwen3-8b-v6e-full-36L-8k": "interop/maxtext_program/tpu_terms.py: which side of the layers' "
    "backward an untied head's gradient is made on (v6e, after: the logits' gradient held)",
    "mistral-7b-v5p-custom-32L-8k": "interop/maxtext_program/tpu_terms.py: which side of the "
    "layers' backward an untied head's gradient is made on (a step that offloads: after)",
    "llama2-7b-v7x-minimal-32L-8k": "interop/maxtext_program/tpu_terms.py: which side of the "
    "layers' backward an untied head's gradient is made on (TPU7x, at the loss: held unsharded)",
    "llama3-8b-v6e-full-32L-8k": "interop/maxtext_program/tpu_terms.py: which side of the "
    "layers' backward an untied head's gradient is made on (v6e, a decoder without query and key "
    "norms: reduce-scattered at the loss, its shard held)",
    "llama4-17b-16e-v5p-4L": "interop/maxtext_program/trace.py: the routed experts' parameters "
    "read from MaxText's state, so that under expert parallelism a layer gathers its E / expert "
    "local experts",
    "llama4-17b-16e-v5p-qkv-offload-4L": "interop/maxtext_program/tpu_moe.py: a single trip's "
    "backward under a policy that saves names gathers one routed layer's experts at a time",
    "olmo3-7b-v6e-full-8L": "interop/maxtext_program/tpu_blocks.py: on v6e a scanned block's "
    "backward gathers one of its layers' weights at a time",
    "olmo3-7b-v6e-qkv-offload-4L": "interop/maxtext_program/tpu_offload.py: a scan that runs "
    "once, inlined, makes each offloaded value's host round trip in its layer's forward, one "
    "layer's values in the host heap at a time",
    "olmo3-7b-v6e-full-4L": "interop/maxtext_program/tpu_blocks.py (one layer's weights gathered "
    "at a time on v6e) and tpu_single_trip.py: a dense single-trip stack holds its residuals and "
    "its last layer's gathered weights at the loss",
    **{
        name: "interop/maxtext_program/tpu_terms.py: on v5e the tied table's gather spans the "
        "layers' forward loop, its slot above the forward's buffers, the logits-sized buffer and "
        "the head's gradient above it"
        for name in (
            "gemma2-2b-v5e-save-all",
            "gemma2-2b-v5e-full",
            "gemma2-2b-v5e-qkv-offload",
            "gemma2-2b-v5e-qkv-offload-3L",
        )
    },
    "gemma2-2b-v5e-qkv-offload": "interop/maxtext_program/tpu_terms.py (on v5e the tied table's "
    "gather spans the layers' forward loop) and tpu_offload.py: an unrolled two-trip scan holds "
    "its stacks and one layer of its block's offloaded values in host buffers of their own",
}
# Seen cases were compiled with MaxText's train_compile's own libtpu options only (before compile
# --maxtext added the flags tierax models the program under); they stay so, with
# --maxtext-flags-only, so that their compiles are the record's.  Held-out cases compile with the
# modelled flags (compile --maxtext's default), the program simulate predicts.
FLAGS_ONLY = "--maxtext-flags-only"


def _argv(verb: str, keys: list[str], target: str, devices: int, extra=()) -> list[str]:
    """The child's tierax arguments (``extra``: tierax options, before ``--json``)."""
    return [
        verb, "--maxtext", _maxtext.base_yml(), *keys, "--target", target,
        "--devices", str(devices), *extra, "--json",
    ]  # fmt: skip


def _child(verb: str, keys: list[str], target: str, devices: int, dump=None, extra=()) -> dict:
    cmd = _common.tierax(*_argv(verb, keys, target, devices, extra))
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


def compile_side(keys, target, devices, dump=None, extra=()) -> dict:
    r = _child("compile", keys, target, devices, dump, extra)
    if "json" not in r:
        return r
    j = r.pop("json")
    keep = ("fits", "device_peak_bytes", "device_argument_bytes", "device_temp_bytes",
            "device_output_bytes", "device_alias_bytes", "host_temp_bytes", "attention",
            "cudnn_calls", "cudnn_workspace_bytes", "tpu_custom_calls", "compile_time_s",
            "libtpu_version", "out_of_memory", "xla_error", "xla_environment",
            "modelled_flags")  # fmt: skip
    return r | {k: j.get(k) for k in keep}


def simulate_side(keys, target, devices, extra=()) -> dict:
    r = _child("simulate", keys, target, devices, extra=extra)
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
        "modelled_flags": j.get("maxtext", {}).get("flags"),
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


def _extra(c: dict) -> str:
    """A case's policy: its MaxText keys after the model's and sizes, and tierax's --plan."""
    keys = [k for k in c["keys"] if k.partition("=")[0] not in _SIZE_KEYS]
    return " ".join([*keys, *([f"--plan {c['plan']}"] if c.get("plan") else [])])


_SIZE_KEYS = ("model_name", "override_model_config", "base_num_decoder_layers",
              "per_device_batch_size", "max_target_length")  # fmt: skip


def summary(cases: list[dict]) -> dict:
    """The record's figures: per split (seen, held out) the cases compared and within the bounds,
    and each full-depth case's predicted ÷ compiled peak."""
    out = {}
    for split, held in (("seen", False), ("held_out", True)):
        rows = [c for c in cases if bool(c.get("held_out")) == held]
        compared = [c for c in rows if "within" in c]
        out[split] = {"cases": len(rows), "compared": len(compared),
                      "within": sum(c["within"] for c in compared)}  # fmt: skip
    out["full_depth_ratio"] = {
        c["name"]: 1 + c["peak_error"]
        for c in cases
        if c.get("layers") is None and "peak_error" in c
    }
    return out


def render(doc: dict) -> str:
    gib = 2**30
    lines = [
        "| case | split | target × devices | layers | remat / tiling / plan | tierax predicted "
        "peak "
        "(GiB) | MaxText's compile peak (GiB) | error | host: tierax / compile (GiB) | "
        "within 5 % |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cases"]:
        s, x = c.get("simulate", {}), c.get("compile", {})
        ours = f"{s['peak_device_bytes'] / gib:.3f}" if "peak_device_bytes" in s else (
            f"error: {s.get('error', '—')[:120]}")  # fmt: skip
        if x.get("out_of_memory"):
            theirs = f"refused (out of memory; needs {(x.get('device_peak_bytes') or 0) / gib:.3f})"
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
        split = (
            "held out"
            if c.get("held_out")
            else "seen" + (" (read after)" if c.get("rule_read") else "")
        )
        layers = "all" if c.get("layers", LAYERS) is None else c.get("layers", LAYERS)
        lines.append(
            f"| {c['name']} | {split} | {c['target']} × {c['devices']} | {layers} | {_extra(c)} | "
            f"{ours} | {theirs} | {err} | {host} | {within} |"
        )
    fig = summary(doc["cases"])
    lines.append("")
    for split, words in (("seen", "seen (a rule was read from its compile)"),
                         ("held_out", "held out (added after the rules)")):  # fmt: skip
        f = fig[split]
        lines.append(
            f"* {words}: {f['within']} of {f['compared']} compared cases within {TOLERANCE:.0%} "
            f"(peak) and {HOST_TOLERANCE:.0%} (host); {f['cases'] - f['compared']} not compared "
            "(an error or XLA's refusal on either side)."
        )
    if fig["full_depth_ratio"]:
        ratios = ", ".join(f"{n} {r:.3f}" for n, r in fig["full_depth_ratio"].items())
        lines.append(f"* full depth, predicted ÷ compiled peak: {ratios}.")
    lines.append("")
    lines.append(
        f"Seen cases: model files cut to {doc['layers']} decoder layers (a case named -<n>L: n); "
        f"command: `{doc['command']}`."
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
                earlier[_as_run(c["compile"])] = c["compile"]

    def run_case(name, model, target, devices, batch, seq, extra, *rest) -> dict:
        added = len(rest) == 2  # a HELD_OUT case: (layers, plan), compiled with the flags
        held_out = added and name not in READ_FROM
        layers = rest[0] if rest else LAYERS
        plan = rest[1] if added else None
        keys = (
            _maxtext.keys(model, layers, batch, seq, extra)
            if layers is not None
            else [f"model_name={model}", f"per_device_batch_size={batch}",
                  f"max_target_length={seq}", *extra]
        )  # fmt: skip
        given = ["--plan", plan] if plan else []
        case = {"name": name, "model": model, "target": target, "devices": devices,
                "layers": layers, "per_device_batch_size": batch, "seq": seq,
                "keys": keys, "plan": plan, "held_out": held_out}  # fmt: skip
        if name in READ_FROM:
            case["rule_read"] = READ_FROM[name]
        case["simulate"] = simulate_side(keys, target, devices, given)
        flags = given + ([] if added else [FLAGS_ONLY])
        command = "tierax " + " ".join(_argv("compile", keys, target, devices, flags)[:])
        if command in earlier:
            case["compile"] = earlier[command] | {"reused": True}
        else:
            dump = pathlib.Path(args.dump_dir) / name if args.dump_dir else None
            case["compile"] = compile_side(keys, target, devices, dump, flags)
        compare(case)
        return case

    return run_case


def _as_run(compiled: dict) -> str:
    """An earlier compile's command as this script gives it now: one recorded before compile
    --maxtext stated its flags (no ``xla_environment``) ran with MaxText's own flags only, what
    ``--maxtext-flags-only`` now asks for."""
    command = compiled["command"]
    if "xla_environment" in compiled or FLAGS_ONLY in command:
        return command
    return command.removesuffix(" --json") + f" {FLAGS_ONLY} --json"


def main(argv=None) -> int:
    return _maxtext.run_cases(
        argv,
        doc=__doc__,
        out="maxtext_fidelity.json",
        schema=SCHEMA,
        marker=MARKER,
        cases=[*CASES, *HELD_OUT],
        run_case=None,
        render=render,
        fields={"layers": LAYERS, "tolerance": TOLERANCE, "host_tolerance": HOST_TOLERANCE},
        finish=lambda record: record | {"summary": summary(record["cases"])},
        add_args=_options,
        bind=_bind,
    )


if __name__ == "__main__":
    sys.exit(main())
