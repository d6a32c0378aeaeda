#!/usr/bin/env python3
"""Which side of MaxText's layers' backward loop XLA:TPU makes an untied head's gradient on, beside
the side tierax's rule gives (``tpu_terms.head_grad_schedule``).

Question: does ``head_grad_schedule`` (after the loop; at the loss; on v6e reduce-scattered at the
loss) give the side XLA:TPU schedules the head gradient's dot on, for the MaxText cuts its reading
was taken from?  Answered: for 23 of the 25 cuts the record holds (the last five, which change
the decoder's query and key norms or its MLP width one at a time on v6e, added for the rule's v6e
reading by the norms, their rows merged into the record and every row's rule side recomputed
without compiling again: the record's ``merged``); it misses qwen3-8b's on v6e with one sequence
of 12288 or 16384 tokens a device (after, the rule says at the loss, as XLA makes it for the same
tokens as 3 × 4096 or 2 × 8192), misses ``tpu_terms``' module docstring names.
Records: bench/results/head_grad_side.json
Docs: docs/results/maxtext-fidelity.md

Each case is MaxText's ``configs/base.yml`` with ``model_name`` (its model file's sizes, cut to 2 or
3 layers with ``override_model_config=true``), compiled deviceless for 8 devices (fsdp 8) by
``tierax compile --maxtext ... --target T --devices 8 --json`` in a child process (the flags
``simulate --maxtext`` models, the installed libtpu) with XLA's dump written (``--xla_dump_to``).
XLA's side is read from the dump's scheduled entry computation (:func:`xla_side`): the head
gradient's dot (an ``[emb, vocab]`` output, ``transpose(jvp())/dot_general`` metadata) before the
last backward while loop (``transpose(jvp())`` metadata) is at the loss, after it after; at the
loss, a reduce-scatter of it into the ``[emb / fsdp, vocab]`` shard scheduled before that loop
(fused with the dot or not) is reduce-scattered at the loss.  Where the entry does not show one
dot or the loop, the row says undecided and why.  The rule's side is ``head_grad_schedule`` on the
config and inventory tierax traces from the same keys (``tierax.interop.maxtext_program``), with
the step's offload read from MaxText's remat policy as tierax's Plan.  Every case's tokens are its
per-device batch × sequence.

    python bench/investigations/head_grad_side.py [--cases NAME,...] \\
        [--out bench/results/head_grad_side.json]
"""

from __future__ import annotations

import pathlib
import re
import sys
import tempfile

BENCH = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: _common, _maxtext

import _common  # noqa: E402

SCHEMA = "tierax.head-grad-side/1"
DEVICES = 8
AFTER, AT_LOSS, SCATTERED_AT_LOSS = "after", "at the loss", "reduce-scattered at the loss"
UNDECIDED = "undecided"
# MaxText's custom remat policy with q, k and v offloaded to the host, as the mistral-7b custom
# rows of bench/maxtext_fidelity.py set it
_OFF = [
    "remat_policy=custom",
    "query_proj=offload",
    "key_proj=offload",
    "value_proj=offload",
    "mlpwo=device",
]
_FULL = ["remat_policy=full"]
# (name, MaxText model, target, layers, per-device batch, sequence, extra MaxText keys)
CASES = [
    ("qwen3-8b-v5p-2k", "qwen3-8b", "v5p", 2, 1, 2048, _FULL),
    ("qwen3-8b-v5p-4k", "qwen3-8b", "v5p", 2, 1, 4096, _FULL),
    ("qwen3-8b-v5p-8k", "qwen3-8b", "v5p", 2, 1, 8192, _FULL),
    ("qwen3-8b-v5p-2k-emb2048", "qwen3-8b", "v5p", 2, 1, 2048, [*_FULL, "base_emb_dim=2048"]),
    ("qwen3-8b-v6e-8k", "qwen3-8b", "v6e", 2, 1, 8192, _FULL),
    ("qwen3-8b-v6e-12k", "qwen3-8b", "v6e", 2, 1, 12288, _FULL),
    ("qwen3-8b-v6e-16k", "qwen3-8b", "v6e", 2, 1, 16384, _FULL),
    # the same tokens per device in several sequences
    ("qwen3-8b-v6e-3x4k", "qwen3-8b", "v6e", 2, 3, 4096, _FULL),
    ("qwen3-8b-v6e-2x8k", "qwen3-8b", "v6e", 2, 2, 8192, _FULL),
    ("qwen3-8b-v6e-8k-v32000", "qwen3-8b", "v6e", 2, 1, 8192, [*_FULL, "vocab_size=32000"]),
    ("qwen3-8b-v6e-8k-v64000", "qwen3-8b", "v6e", 2, 1, 8192, [*_FULL, "vocab_size=64000"]),
    ("qwen3-8b-v6e-8k-v128256", "qwen3-8b", "v6e", 2, 1, 8192, [*_FULL, "vocab_size=128256"]),
    ("qwen3-8b-v6e-8k-v131200", "qwen3-8b", "v6e", 2, 1, 8192, [*_FULL, "vocab_size=131200"]),
    ("qwen3-8b-v6e-8k-v151808", "qwen3-8b", "v6e", 2, 1, 8192, [*_FULL, "vocab_size=151808"]),
    ("qwen3-8b-v7x-4k", "qwen3-8b", "v7x", 2, 1, 4096, _FULL),
    ("mistral-7b-v5p-full-2x8k", "mistral-7b", "v5p", 2, 2, 8192, _FULL),
    ("mistral-7b-v5p-custom-2x8k-3L", "mistral-7b", "v5p", 3, 2, 8192, _OFF),
    ("llama2-7b-v6e-minimal-8k", "llama2-7b", "v6e", 2, 1, 8192, ["remat_policy=minimal"]),
    ("llama2-7b-v7x-minimal-8k", "llama2-7b", "v7x", 2, 1, 8192, ["remat_policy=minimal"]),
    ("llama3-8b-v6e-full-8k", "llama3-8b", "v6e", 2, 1, 8192, _FULL),
    # llama3-8b's and qwen3-8b's decoders told apart at llama3-8b's vocabulary, one property each
    ("qwen3-8b-v6e-8k-v128256-mlp14336", "qwen3-8b", "v6e", 2, 1, 8192,
     [*_FULL, "vocab_size=128256", "base_mlp_dim=14336"]),
    ("qwen3-8b-v6e-8k-v128256-no-qk-norm", "qwen3-8b", "v6e", 2, 1, 8192,
     [*_FULL, "vocab_size=128256", "use_qk_norm=false"]),
    ("llama3-8b-v6e-full-8k-mlp12288", "llama3-8b", "v6e", 2, 1, 8192,
     [*_FULL, "base_mlp_dim=12288"]),
    # qwen3-8b without query and key norms at its own vocabulary, one sequence of 8192 and 12288
    ("qwen3-8b-v6e-8k-no-qk-norm", "qwen3-8b", "v6e", 2, 1, 8192, [*_FULL, "use_qk_norm=false"]),
    ("qwen3-8b-v6e-12k-no-qk-norm", "qwen3-8b", "v6e", 2, 1, 12288, [*_FULL, "use_qk_norm=false"]),
]  # fmt: skip

_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (.*)$")
_ARRAY = re.compile(r"\b[a-z]+\d*\[([\d,]*)\]")


def entry_instructions(hlo: str) -> list[tuple[str, str]]:
    """The scheduled entry computation of an optimized HLO module's text: ``(name, the text after
    '=')`` per instruction, in schedule order."""
    start = hlo.index("\nENTRY")
    # its closing brace alone on a line (a custom call's config may break a line at "}}")
    body = re.split(r"\n}[ \t]*\n", hlo[start:] + "\n", maxsplit=1)[0].splitlines()[1:]
    return [(m.group(1), m.group(2)) for m in map(_INSTRUCTION.match, body) if m]


def _split(rhs: str) -> tuple[str, str]:
    """An instruction's output type and opcode."""
    out = rhs.split(" ", 1)[0] if not rhs.startswith("(") else rhs[: rhs.index(") ") + 1]
    return out, rhs[len(out) :].split("(", 1)[0].strip()


def _dims(rhs: str) -> list[tuple[int, ...]]:
    """The array shapes of an instruction's output type (a tuple's elements in order)."""
    return [tuple(int(d) for d in m.split(",") if d) for m in _ARRAY.findall(_split(rhs)[0])]


def _collective(name: str, rhs: str) -> bool:
    """Whether an instruction reduces or gathers across devices (its name, opcode or called
    computation says so)."""
    head = name + " " + rhs.split(", metadata=")[0]
    return any(c in head for c in ("all-reduce", "reduce-scatter", "all-gather"))


def xla_side(hlo: str, emb: int, vocab: int, fsdp: int) -> tuple[str, str]:
    """Where an optimized HLO module (its text) makes an untied head's gradient against the
    layers' backward loop: ``(side, why)``, side one of :data:`AFTER`, :data:`AT_LOSS`,
    :data:`SCATTERED_AT_LOSS` or :data:`UNDECIDED`.

    The backward loop: the entry's last ``while`` with ``transpose(jvp())`` metadata (the layers'
    scan; where XLA peels a layer out of it, as under a host offload, the peeled layer's own loops
    may come after it).  The head
    gradient's dot: an entry instruction with ``transpose(jvp())/dot_general`` metadata, a fusion,
    convolution or dot that is no collective, whose output is ``[emb, vocab]`` (or ``[vocab,
    emb]``).  Its reduce-scatter: one with that metadata
    whose name, opcode or called computation says ``reduce-scatter`` and whose output holds the
    ``[emb / fsdp, vocab]`` shard (or ``[vocab, emb / fsdp]``): where it is scheduled before the
    loop, the gradient is reduce-scattered at the loss (the dot may be inside it, unseen)."""
    ins = entry_instructions(hlo)
    loops = [i for i, (_, rhs) in enumerate(ins) if " while(" in rhs and "transpose(jvp())" in rhs]
    if not loops:
        return UNDECIDED, "no while loop with transpose(jvp()) metadata in the entry computation"
    loop = max(loops)
    full = {(emb, vocab), (vocab, emb)}
    shard = {(emb // fsdp, vocab), (vocab, emb // fsdp)}
    grad = [i for i, (_, rhs) in enumerate(ins) if "transpose(jvp())/dot_general" in rhs]
    dots = [
        i
        for i in grad
        if _split(ins[i][1])[1] in ("fusion", "convolution", "dot")
        and not _collective(*ins[i])
        and _dims(ins[i][1])[:1]
        and _dims(ins[i][1])[0] in full
    ]
    scatters = [
        i
        for i in grad
        if "reduce-scatter" in ins[i][0] + ins[i][1].split(", metadata=")[0]
        and shard & set(_dims(ins[i][1]))
    ]
    where = f"backward loop {ins[loop][0]} at {loop}"
    named = ", ".join(f"{ins[i][0]} at {i}" for i in sorted({*dots, *scatters}))
    if len(dots) > 1 and min(dots) < loop < max(dots):
        return UNDECIDED, f"head-shaped dots on both sides of the loop: {named}; {where}"
    if not dots and not scatters:
        return (
            UNDECIDED,
            f"no [emb, vocab] dot or reduce-scatter with dot_general metadata; {where}",
        )
    first = min([*dots, *scatters])
    if first > loop:
        return AFTER, f"{named}; {where}"
    if any(i < loop for i in scatters):
        return SCATTERED_AT_LOSS, f"{named}; {where}"
    return AT_LOSS, f"{named}; {where}"


def rule_side(base: str, keys: list[str], target: str) -> dict:
    """``head_grad_schedule``'s side for MaxText's ``keys`` on ``target`` (8 devices), from the
    config and inventory tierax traces, and the shapes it reads."""
    from tierax.interop.maxtext_program import inventory, load, program
    from tierax.interop.maxtext_program.config import embedding_shards
    from tierax.interop.maxtext_program.tpu_terms import head_grad_schedule, qk_norm

    mp = program(base, keys, target=target, devices=DEVICES)
    offloads = any(
        where.value == "offload"
        for group in mp.plan.groups.values()
        for where in group.placements.values()
    )
    inv = inventory(base, keys, mesh=mp.mesh)
    with load(base, keys, mesh=mp.mesh) as loaded:
        config = loaded.config
        side = head_grad_schedule(config, inv, target, offloads)
        return {
            "rule_side": side,
            "tokens_per_device": int(inv.microbatch) * int(inv.seq),
            "microbatch": int(inv.microbatch),
            "seq": int(inv.seq),
            "emb": int(config.emb_dim),
            "vocab": int(config.vocab_size),
            "dtype": str(config.dtype),
            "tied": bool(getattr(config, "logits_via_embedding", False)),
            "qk_norm": qk_norm(config),
            "fsdp": embedding_shards(inv),
            "mesh": dict(inv.mesh),
            "offloads": offloads,
        }


def compile_dumped(base: str, keys: list[str], target: str, dump: pathlib.Path) -> dict:
    """``tierax compile --maxtext`` of the case in a child process, XLA's dump in ``dump``: its
    wall time, libtpu and the entry module's optimized HLO text (or the child's error)."""
    import json

    import _maxtext

    cmd = _common.tierax(
        "compile", "--maxtext", base, *keys, "--target", target, "--devices", str(DEVICES), "--json"
    )
    proc = _common.run(cmd, timeout=3600, env=_maxtext.env(dump))
    out = {"compile_wall_s": round(proc.wall_s, 1), "returncode": proc.returncode}
    if proc.returncode != 0:
        return out | {"error": (proc.stderr.strip().splitlines() or [""])[-1][-600:]}
    r = json.loads(proc.stdout)
    texts = sorted(dump.glob("*jit_train_step*.after_optimizations.txt"))
    out |= {"libtpu_version": r.get("libtpu_version"), "compile_time_s": r.get("compile_time_s")}
    if len(texts) != 1:
        return out | {"error": f"{len(texts)} optimized jit_train_step modules in the dump"}
    return out | {"hlo": texts[0].read_text()}


def run_case(case: tuple, base: str) -> dict:
    import _maxtext

    name, model, target, layers, batch, seq, extra = case
    keys = _maxtext.keys(model, layers, batch, seq, extra)
    row = {"case": name, "keys": keys, "target": target, "devices": DEVICES}
    print(f"{name}: the rule's side (tracing MaxText)", flush=True)
    row |= rule_side(base, keys, target)
    print(f"{name}: compiling for {target} (tierax compile --maxtext, dumped)", flush=True)
    with tempfile.TemporaryDirectory(prefix="tierax-head-grad-") as tmp:
        c = compile_dumped(base, keys, target, pathlib.Path(tmp))
    hlo = c.pop("hlo", None)
    row |= c
    if hlo is None:
        row |= {"xla_side": UNDECIDED, "xla_why": f"the compile failed: {c.get('error')}"}
    else:
        side, why = xla_side(hlo, row["emb"], row["vocab"], row["fsdp"])
        row |= {"xla_side": side, "xla_why": why}
    row["agree"] = None if row["xla_side"] == UNDECIDED else row["xla_side"] == row["rule_side"]
    print(f"{name}: XLA {row['xla_side']}, rule {row['rule_side']} ({row['xla_why']})", flush=True)
    return row


def table(rows: list[dict]) -> str:
    head = "| case | target | tokens | emb | vocab | XLA's side | the rule's side | agree |"
    lines = [head, "|" + " --- |" * 8]
    for r in rows:
        agree = {True: "yes", False: "**no**", None: "—"}[r["agree"]]
        lines.append(
            f"| {r['case']} | {r['target']} | {r['tokens_per_device']} | {r['emb']} | "
            f"{r['vocab']} | {r['xla_side']} | {r['rule_side']} | {agree} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "head_grad_side.json")
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    args = ap.parse_args(argv)
    chosen = CASES
    if args.cases:
        names = args.cases.split(",")
        unknown = sorted(set(names) - {c[0] for c in CASES})
        if unknown:
            ap.error(f"unknown cases {unknown}; known: {', '.join(c[0] for c in CASES)}")
        chosen = [c for c in CASES if c[0] in names]
    import os

    import _maxtext

    os.environ.update(_maxtext.env())  # MaxText traced here on the host platform, as its children
    base = _maxtext.base_yml()
    doc = _common.envelope(SCHEMA, argv)
    doc["rows"] = []
    for i, case in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {case[0]}", flush=True)
        doc["rows"].append(run_case(case, base))
        _common.write_record(args.out, doc)  # each case kept as it finishes
    decided = [r for r in doc["rows"] if r["agree"] is not None]
    doc["agree"] = f"{sum(r['agree'] for r in decided)} of {len(decided)} decided rows"
    print(table(doc["rows"]))
    print(f"agree: {doc['agree']}")
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    sys.exit(main())
