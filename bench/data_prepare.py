#!/usr/bin/env python3
"""`tierax data prepare` throughput and peak memory on two corpus sizes, per tokenizer kind.

The corpora are JSONL built from data/sample.txt (public domain, see data/README.md): its
paragraphs, one per line, repeated in order until the corpus reaches its size, each copy
numbered (``"copy N: ..."``) so no two documents are byte-identical.  The tokenizers are built
here from the same text (no download): a byte-level BPE with the ``tokenizers`` trainer, a
SentencePiece BPE with Llama 2's settings, and a tiktoken BPE file from the BPE's merges; plus the
byte-level tokenizer.  Each run is the real CLI in its own process: wall time, tokens written,
tokens/s and the process's peak resident memory (``wait4``'s ``ru_maxrss``).

    .venv/bin/python bench/data_prepare.py [--sizes-mib 16,160] [--kinds bytes,huggingface,...]
    .venv/bin/python bench/data_prepare.py --docs bench/results/data_prepare.json  # docs table

writes bench/results/data_prepare.json and prints a table.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pathlib
import shutil
import tempfile
from importlib import metadata

import _common

ROOT = pathlib.Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "sample.txt"
KINDS = ("bytes", "huggingface", "sentencepiece", "tiktoken")
VOCAB = 4096


def build_corpus(path: pathlib.Path, size: int) -> int:
    """JSONL of the sample's paragraphs, numbered copies, to ``size`` bytes; its document count."""
    paras = [p for p in SAMPLE.read_text().splitlines() if p.strip()]
    n = written = 0
    with open(path, "w") as f:
        while written < size:
            for p in paras:
                line = json.dumps({"text": f"copy {n // len(paras)}: {p}"}) + "\n"
                f.write(line)
                written += len(line)
                n += 1
                if written >= size:
                    break
    return n


def build_tokenizers(d: pathlib.Path) -> dict[str, str]:
    import sentencepiece as spm
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([str(SAMPLE)], trainer)
    spec = json.loads(tok.to_str())
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))],
    )
    tok.save(str(d / "tokenizer.json"))
    spm.SentencePieceTrainer.train(
        input=str(SAMPLE),
        model_prefix=str(d / "sp"),
        vocab_size=VOCAB,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        max_sentence_length=1 << 16,
        minloglevel=2,
    )
    # tiktoken's format: the 256 bytes, then each merge's bytes in merge order (GPT-2's byte table).
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    )
    chars, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    to_byte = {chr(c): b for b, c in zip(printable, chars, strict=True)}
    ranks = {bytes([b]): b for b in range(256)}
    for merge in spec["model"]["merges"]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        ranks.setdefault(bytes(to_byte[ch] for ch in left + right), len(ranks))
    (d / "tokenizer.model").write_text(
        "".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items())
    )
    return {
        "bytes": "bytes",
        "huggingface": str(d / "tokenizer.json"),
        "sentencepiece": str(d / "sp.model"),
        "tiktoken": str(d / "tokenizer.model"),
    }


def run_prepare(corpus: pathlib.Path, tokenizer: str, out: pathlib.Path) -> dict:
    """One `tierax data prepare` in its own process: wall time and peak RSS from wait4."""
    cmd = _common.tierax(
        "data", "prepare", str(corpus), "--out", str(out), "--tokenizer", tokenizer
    )
    r = _common.run(cmd)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    wall = r.wall_s
    index = json.loads((out / "index.json").read_text())
    tokens = sum(s["num_tokens"] for s in index["splits"].values())
    return {
        "command": " ".join(["tierax", *cmd[3:]]),
        "wall_s": round(wall, 3),
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall),
        "input_mib_per_s": round(corpus.stat().st_size / wall / 2**20, 2),
        "peak_rss_mib": round(r.peak_rss_bytes / 2**20, 1),
        "cpu_s": round(r.cpu_s, 2),
        "stdout": r.stdout.strip(),
    }


DOCS_MARKER = "data-prepare"


def _rate(n: float) -> str:
    return f"{n / 1e6:#.3g} M"


def markdown(doc: dict) -> str:
    """The docs table of the record: per tokenizer, tokens/s and peak RSS at each corpus size
    (every figure read from it)."""
    sizes = sorted({r["corpus_mib"] for r in doc["runs"]})
    kinds = list(dict.fromkeys(r["tokenizer"] for r in doc["runs"]))
    runs = {(r["tokenizer"], r["corpus_mib"]): r for r in doc["runs"]}
    head = [f"tokens/s, {s} MiB" for s in sizes] + [f"peak RSS, {s} MiB" for s in sizes]
    lines = ["| tokenizer | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for kind in kinds:
        cells = [
            _rate(runs[kind, s]["tokens_per_s"]) if (kind, s) in runs else "—" for s in sizes
        ] + [
            f"{runs[kind, s]['peak_rss_mib']:.1f} MiB" if (kind, s) in runs else "—" for s in sizes
        ]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    load = ", ".join(f"{x:.1f}" for x in doc.get("load_average_after", []))
    lines += [
        "",
        f"`{doc['command']}`, {doc['created'][:10]}, {doc['cpu_count']} cores, load average after "
        f"{load}; corpus: {doc['corpus']}; tokenizer vocabulary {doc['tokenizer_vocab']}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_docs(ap, "tierax.data_prepare/1", nothing="tokenized")
    ap.add_argument("--sizes-mib", default="16,160", help="corpus sizes in MiB (default 16,160)")
    ap.add_argument(
        "--kinds", default=",".join(KINDS), help=f"tokenizer kinds (default {','.join(KINDS)})"
    )
    _common.add_out(ap, "data_prepare.json")
    args = ap.parse_args(argv)
    if args.docs:
        doc = args.docs
        print(f"wrote {_common.write_docs_table(DOCS_MARKER, markdown(doc))}")
        return 0
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    kinds = [k for k in args.kinds.split(",") if k]

    from rich.console import Console
    from rich.progress import Progress

    work = pathlib.Path(tempfile.mkdtemp(prefix="tierax-data-bench-"))
    console = Console(stderr=True)
    runs = []
    try:
        tokenizers = build_tokenizers(work)
        with Progress(console=console, transient=True) as prog:
            task = prog.add_task("data prepare", total=len(sizes) * len(kinds))
            for mib in sizes:
                corpus = work / f"corpus-{mib}mib.jsonl"
                docs = build_corpus(corpus, mib << 20)
                for kind in kinds:
                    prog.update(task, description=f"{mib} MiB · {kind}")
                    r = run_prepare(corpus, tokenizers[kind], work / f"out-{mib}-{kind}")
                    shutil.rmtree(work / f"out-{mib}-{kind}")
                    runs.append(
                        {
                            "corpus_mib": mib,
                            "corpus_bytes": corpus.stat().st_size,
                            "documents": docs,
                            "tokenizer": kind,
                            **r,
                        }
                    )
                    prog.advance(task)
                corpus.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    versions = {}
    for pkg in ("numpy", "tokenizers", "sentencepiece", "tiktoken", "pyarrow"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    doc = _common.envelope("tierax.data_prepare/1", argv) | {
        "versions": versions,
        "cpu_count": os.cpu_count(),
        "load_average_after": os.getloadavg(),
        "corpus": "JSONL of data/sample.txt's paragraphs, numbered copies, repeated to the size",
        "tokenizer_vocab": VOCAB,
        "runs": runs,
    }
    _common.write_record(args.out, doc)
    print("| corpus | tokenizer | tokens | wall s | tokens/s | MiB/s in | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        print(
            f"| {r['corpus_mib']} MiB | {r['tokenizer']} | {r['tokens']:,} | {r['wall_s']} | "
            f"{r['tokens_per_s']:,} | {r['input_mib_per_s']} | {r['peak_rss_mib']} |"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
