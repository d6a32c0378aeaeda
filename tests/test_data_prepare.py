"""`tierax data prepare`: every tokenizer kind (built on the fly from data/sample.txt), text,
JSONL and Parquet inputs, shards, validation hold-out, determinism, and bad input."""

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tokenizer_files as TF

from tierax.errors import TieraxError
from tierax.train import data as D
from tierax.train.data.tokenizer import detect_kind, load_tokenizer

SAMPLE = TF.SAMPLE


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokenizers")
    return {
        "huggingface": TF.hf_bpe(d / "hf"),
        "sentencepiece": TF.sentencepiece_model(d / "sp"),
        "tiktoken": TF.tiktoken_file(d / "tt"),
    }


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    p = tmp_path_factory.mktemp("docs") / "docs.jsonl"
    p.write_text(
        "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TF.paragraphs()))
    )
    return p


def documents(out, split="train"):
    """The token arrays of a split's documents, in order."""
    c = D.open_corpus(out, split=split)
    starts = np.concatenate([[0], c.doc_ends[:-1]])
    return [c.read(int(a), int(b - a)) for a, b in zip(starts, c.doc_ends, strict=True)]


def test_byte_level_prepare_keeps_the_bytes(tmp_path):
    raw = SAMPLE.read_bytes()
    index = D.prepare_text(SAMPLE, tmp_path / "d")
    assert (
        index["tokenizer"]["kind"] == "bytes"
        and index["vocab_size"] == 256
        and index["dtype"] == "uint8"
    )
    train = index["splits"]["train"]
    assert train["num_tokens"] == len(raw) and train["num_documents"] == 1
    assert (tmp_path / "d" / "train-00000.bin").read_bytes() == raw  # byte-level: ids are the bytes
    assert train["shards"][0]["sha256"] == hashlib.sha256(raw).hexdigest()
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [
        "index.json",
        "train-00000.bin",
        "train-docs.bin",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no temporaries left


@pytest.mark.parametrize("kind", ["huggingface", "sentencepiece", "tiktoken"])
def test_round_trip_per_tokenizer_kind(kind, tokenizers, jsonl, tmp_path):
    """decode(tokens) is each input document again, framed by BOS and EOS; several shards."""
    index = D.prepare([jsonl], tmp_path / "out", tokenizer=str(tokenizers[kind]), shard_tokens=5000)
    tok = index["tokenizer"]
    assert tok["kind"] == kind and tok["add_bos"] and tok["eos_id"] is not None
    assert tok["sha256"] == hashlib.sha256(tokenizers[kind].read_bytes()).hexdigest()
    assert index["dtype"] == "uint16" and len(index["splits"]["train"]["shards"]) > 3
    docs = documents(tmp_path / "out")
    texts = TF.paragraphs()
    assert len(docs) == len(texts)
    t = load_tokenizer(tokenizers[kind])
    for ids, text in zip(docs, texts, strict=True):
        assert ids[0] == tok["bos_id"] and ids[-1] == tok["eos_id"]
        assert t.decode(ids[1:-1]) == text


def test_bos_only_where_the_family_expects_it(tmp_path, jsonl):
    """A Hugging Face tokenizer without a BOS post-processor (GPT-2 style) gets EOS only."""
    plain = TF.hf_bpe(tmp_path / "gpt2like", with_bos=False)
    index = D.prepare([jsonl], tmp_path / "out", tokenizer=str(plain))
    assert not index["tokenizer"]["add_bos"]
    first = documents(tmp_path / "out")[0]
    assert first[-1] == index["tokenizer"]["eos_id"] and first[0] != index["tokenizer"]["bos_id"]
    assert load_tokenizer(plain).decode(first[:-1]) == TF.paragraphs()[0]


def test_kind_is_read_from_content_not_extension(tokenizers, tmp_path):
    swapped = {
        "huggingface": "tokenizer.model",
        "sentencepiece": "tokenizer.json",
        "tiktoken": "vocab.json",
    }
    for kind, name in swapped.items():
        (tmp_path / kind).mkdir()
        dst = tmp_path / kind / name
        shutil.copy(tokenizers[kind], dst)
        assert detect_kind(dst) == kind and load_tokenizer(dst).info.kind == kind


def test_prepare_is_deterministic(tokenizers, jsonl, tmp_path):
    for out in ("a", "b"):
        D.prepare(
            [jsonl, SAMPLE],
            tmp_path / out,
            tokenizer=str(tokenizers["sentencepiece"]),
            validation_fraction=0.1,
            shard_tokens=7000,
        )
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir()) and len(names) > 5
    for n in names:
        assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes(), n


def test_validation_holds_out_whole_documents(tokenizers, jsonl, tmp_path):
    index = D.prepare(
        [jsonl], tmp_path / "out", tokenizer=str(tokenizers["huggingface"]), validation_fraction=0.2
    )
    t = load_tokenizer(tokenizers["huggingface"])
    train = [t.decode(d[1:-1]) for d in documents(tmp_path / "out", "train")]
    valid = [t.decode(d[1:-1]) for d in documents(tmp_path / "out", "validation")]
    texts = TF.paragraphs()
    assert sorted(train + valid) == sorted(texts)  # every document whole, in exactly one split
    assert 0.1 < len(valid) / len(texts) < 0.3
    assert set(valid) == {x for x in texts if D.pipeline.held_out(x, 0.2)}
    assert index["splits"]["validation"]["num_documents"] == len(valid)


def test_text_parquet_and_gzip_inputs(tokenizers, jsonl, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = TF.paragraphs()
    pq.write_table(
        pa.table({"body": texts, "n": list(range(len(texts)))}),
        tmp_path / "docs.parquet",
        row_group_size=100,
    )
    with gzip.open(tmp_path / "docs.jsonl.gz", "wt") as f:
        f.write(jsonl.read_text())
    tok = str(tokenizers["tiktoken"])
    D.prepare([jsonl], tmp_path / "j", tokenizer=tok)
    D.prepare([tmp_path / "docs.parquet"], tmp_path / "p", tokenizer=tok, field="body")
    D.prepare([tmp_path / "docs.jsonl.gz"], tmp_path / "g", tokenizer=tok)
    ref = (tmp_path / "j" / "train-00000.bin").read_bytes()
    assert (tmp_path / "p" / "train-00000.bin").read_bytes() == ref
    assert (tmp_path / "g" / "train-00000.bin").read_bytes() == ref
    # A text file is one document.
    (tmp_path / "one.txt").write_text(texts[0])
    (tmp_path / "two.txt").write_text(texts[1])
    idx = D.prepare([tmp_path / "one.txt", tmp_path / "two.txt"], tmp_path / "t", tokenizer=tok)
    assert idx["splits"]["train"]["num_documents"] == 2
    assert [load_tokenizer(tok).decode(d[1:-1]) for d in documents(tmp_path / "t")] == texts[:2]


def test_cli_prepare_reports_and_replaces_only_when_asked(tmp_path, tokenizers, jsonl, cli):
    ok = cli("data", "prepare", str(SAMPLE), "--out", str(tmp_path / "d"))
    assert ok.returncode == 0, ok.stderr
    assert "train: 99,012 tokens in 1 documents" in ok.stdout
    again = cli(
        "data",
        "prepare",
        str(jsonl),
        "--out",
        str(tmp_path / "d"),
        "--tokenizer",
        str(tokenizers["huggingface"]),
        "--validation-fraction",
        "0.1",
    )
    assert again.returncode == 2 and "pass --overwrite" in again.stderr
    assert json.loads((tmp_path / "d" / "index.json").read_text())["tokenizer"]["kind"] == "bytes"
    over = cli(
        "data",
        "prepare",
        str(jsonl),
        "--out",
        str(tmp_path / "d"),
        "--tokenizer",
        str(tokenizers["huggingface"]),
        "--validation-fraction",
        "0.1",
        "--overwrite",
    )
    assert over.returncode == 0, over.stderr
    assert (
        "validation:" in over.stdout
        and "huggingface tokenizer, vocab 1000, uint16; BOS 0, EOS 1" in over.stdout
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    busy = cli("data", "prepare", str(SAMPLE), "--out", str(tmp_path / "mine"), "--overwrite")
    assert busy.returncode == 2 and "not a token directory" in busy.stderr
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


# --- bad input: exit 2 naming the file, nothing written ----------------------------------


def assert_refused(cli, tmp_path, args, *fragments):
    """``data prepare`` exits 2 naming each fragment, with no traceback and nothing written."""
    r = cli("data", "prepare", *map(str, args), "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    for f in fragments:
        assert f in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no temporary left
    return r.stderr


def test_bad_tokenizers_exit_2_naming_the_file(cli, tmp_path, tokenizers, jsonl):
    cut = tmp_path / "tokenizer.json"
    cut.write_bytes(tokenizers["huggingface"].read_bytes()[:5000])
    assert_refused(cli, tmp_path, [jsonl, "--tokenizer", cut], str(cut), "cannot be read")
    bad_sp = tmp_path / "sp.model"
    bad_sp.write_bytes(tokenizers["sentencepiece"].read_bytes()[:3000])
    assert_refused(
        cli,
        tmp_path,
        [jsonl, "--tokenizer", bad_sp],
        str(bad_sp),
        "SentencePiece model but cannot be read",
    )
    bad_tt = tmp_path / "tt.model"
    lines = tokenizers["tiktoken"].read_text().splitlines()
    bad_tt.write_text("\n".join(lines[:10] + ["!!!notbase64 10"] + lines[11:]) + "\n")
    assert_refused(cli, tmp_path, [jsonl, "--tokenizer", bad_tt], str(bad_tt), "line 11")
    noise = tmp_path / "noise.bin"
    noise.write_bytes(bytes(range(256)))
    assert_refused(
        cli, tmp_path, [jsonl, "--tokenizer", noise], str(noise), "is not a tokenizer tierax reads"
    )
    assert_refused(
        cli,
        tmp_path,
        [jsonl, "--tokenizer", tmp_path / "missing.json"],
        "missing.json",
        "does not exist",
    )
    assert_refused(cli, tmp_path, [jsonl, "--tokenizer", tmp_path], str(tmp_path), "is not a file")
    # Unreadable: a file whose read fails (EIO; chmod 000 does not stop root, who runs these tests).
    assert_refused(
        cli, tmp_path, [jsonl, "--tokenizer", "/proc/self/mem"], "/proc/self/mem", "cannot be read"
    )


def test_bad_documents_exit_2_and_leave_nothing(cli, tmp_path, tokenizers):
    texts = TF.paragraphs()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:300]) + '{"body": "x"}\n')
    # Found after 300 documents have been written: the temporary directory goes too.
    assert_refused(
        cli,
        tmp_path,
        [bad, "--tokenizer", tokenizers["huggingface"]],
        f"{bad} line 301: no field 'text'",
        "--field",
    )
    notjson = tmp_path / "notjson.jsonl"
    notjson.write_text('{"text": "a"}\n{"text": \n')
    assert_refused(cli, tmp_path, [notjson], f"{notjson} line 2: not a JSON object")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [1, 2, 3]}), tmp_path / "ints.parquet")
    assert_refused(
        cli,
        tmp_path,
        [tmp_path / "ints.parquet"],
        "ints.parquet",
        "column 'text' is int64, not a string column",
    )
    assert_refused(
        cli,
        tmp_path,
        [tmp_path / "ints.parquet", "--field", "body"],
        "has no column 'body' (its columns: text)",
    )
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    assert_refused(
        cli,
        tmp_path,
        [tmp_path / "latin1.txt", "--tokenizer", tokenizers["tiktoken"]],
        "is not UTF-8",
    )
    h = (
        int.from_bytes(hashlib.blake2b(SAMPLE.read_bytes(), digest_size=8).digest(), "little")
        / 2**64
    )
    assert_refused(
        cli,
        tmp_path,
        [SAMPLE, "--validation-fraction", f"{h * 0.99:.6f}"],
        "no document of the 1 was held out",
    )
    assert_refused(
        cli,
        tmp_path,
        [SAMPLE, "--validation-fraction", f"{min(h * 1.01, 0.999999):.6f}"],
        "every one of the 1 documents was held out",
    )
    assert_refused(cli, tmp_path, [SAMPLE, "--max-document-mib", "0"], "must be ≥ 1")
    assert_refused(cli, tmp_path, ["/proc/self/mem"], "input '/proc/self/mem' cannot be read")


def test_missing_optional_package_names_the_pip_command(tmp_path, tokenizers, jsonl):
    """The GPU machine has `tokenizers` but not sentencepiece/tiktoken/pyarrow: each is imported
    only when used, and its absence is a one-line error naming the pip command."""
    code = (
        "import sys; sys.modules['sentencepiece'] = None; sys.modules['pyarrow'] = None; "
        "from tierax.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def run(*args):
        return subprocess.run(
            [
                sys.executable,
                "-c",
                code,
                "data",
                "prepare",
                *map(str, args),
                "--out",
                str(tmp_path / "out"),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )

    r = run(jsonl, "--tokenizer", tokenizers["sentencepiece"])
    assert (
        r.returncode == 2
        and "pip install 'tierax[data]'" in r.stderr
        and "sentencepiece" in r.stderr
    )
    (tmp_path / "x.parquet").write_bytes(b"PAR1" + b"\0" * 16 + b"PAR1")
    r = run(tmp_path / "x.parquet")
    assert r.returncode == 2 and "`pyarrow` package" in r.stderr
    r = run(jsonl, "--tokenizer", tokenizers["tiktoken"])  # the others still work
    assert r.returncode == 0, r.stderr


def test_checksum_mismatch_and_too_large_vocabulary_stop_training(
    tmp_path, tokenizers, jsonl, console_script
):
    D.prepare(
        [jsonl], tmp_path / "tok", tokenizer=str(tokenizers["huggingface"]), shard_tokens=5000
    )
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        json.dumps(
            {
                "model": "tiny-llama",
                "microbatch": 2,
                "seq": 32,
                "steps": 2,
                "optimizer": {"warmup_steps": 0},
                "data": {"source": "tokens", "path": str(tmp_path / "tok")},
                "log": {"dir": str(tmp_path / "run")},
            }
        )
    )
    r = console_script("train", str(cfg))  # tiny-llama has 256 ids, the tokenizer 1000
    assert (
        r.returncode == 2
        and "has 1000 token ids (huggingface tokenizer) but the model's vocab_size is 256"
        in r.stderr
        and str(tmp_path / "tok") in r.stderr
    )
    shard = tmp_path / "tok" / "train-00002.bin"
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 1
    shard.write_bytes(bytes(raw))
    r = console_script("train", str(cfg), "model.vocab_size=1024")
    assert r.returncode == 2 and f"{shard}: checksum mismatch" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()
    with pytest.raises(TieraxError, match="checksum mismatch"):
        D.open_corpus(tmp_path / "tok")
    assert (
        D.open_corpus(tmp_path / "tok", verify=False).num_tokens > 0
    )  # data.verify: false skips the hash
