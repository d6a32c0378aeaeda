"""The loader: packed windows in epochs (each once per epoch), mixtures, exact resume at any
process count, validation batches, per-process rows; and other tools' token files."""

import json
import pathlib
import struct

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tierax.errors import TieraxError
from tierax.mesh import BATCH_AXES, make_mesh
from tierax.train import data as D
from tierax.train.data.permutation import permute, round_keys
from tierax.train.sections import DataConfig

SAMPLE = pathlib.Path(__file__).parent.parent / "data" / "sample.txt"


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens")
    D.prepare_text(SAMPLE, out)
    return out


@pytest.fixture(scope="module")
def small_dirs(tmp_path_factory):
    """Two small byte-level corpora (several documents each) for epochs and mixtures."""
    base = tmp_path_factory.mktemp("small")
    lines = [ln for ln in SAMPLE.read_text().splitlines() if ln.strip()]
    out = []
    for name, part in (("a", lines[:12]), ("b", lines[12:20])):
        src = base / f"{name}.jsonl"
        src.write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
        D.prepare([src], base / name, shard_tokens=1000)  # several shards: windows span them
        out.append(base / name)
    return out


def stream(path, shape, seed=0, **data):
    cfg = DataConfig(source="tokens", path=str(path), **data)
    return D.open_stream(cfg, shape, seed=seed, vocab_size=256)


def window_index(corpus, seq):
    """Window content → its index (the windows of these corpora are all distinct)."""
    n = (corpus.num_tokens - 1) // seq
    table = {corpus.read(w * seq, seq + 1).tobytes(): w for w in range(n)}
    assert len(table) == n
    return table, n


def test_batches_are_a_function_of_seed_and_step(token_dir):
    shape = D.BatchShape(accum=2, global_batch=8, seq=32)
    a, b = stream(token_dir, shape, seed=1), stream(token_dir, shape, seed=1)
    full = a.rows(7, 0, 8)
    assert full.shape == (2, 8, 33) and full.dtype == np.int32
    np.testing.assert_array_equal(full, b.rows(7, 0, 8))
    # A process holding rows 4:8 reads exactly those rows of the same global batch.
    np.testing.assert_array_equal(full[:, 4:8], b.rows(7, 4, 8))
    assert not np.array_equal(full, a.rows(8, 0, 8))
    assert not np.array_equal(full, stream(token_dir, shape, seed=2).rows(7, 0, 8))
    # Every row is a window of the text at a multiple of seq.
    text = np.frombuffer(SAMPLE.read_bytes(), np.uint8)
    for row in full.reshape(-1, 33):
        starts = [
            s
            for s in np.flatnonzero(text[: len(text) - 32] == row[0])
            if np.array_equal(text[s : s + 33], row)
        ]
        assert starts and starts[0] % 32 == 0


def test_every_window_once_per_epoch(small_dirs):
    """Read by content: each epoch's rows are the corpus's windows, each once, in a new order.

    Sampling offsets with replacement (the loader before epochs) fails this: rows at arbitrary
    offsets match no window, and windows repeat or are missed within an epoch."""
    seq, shape = 16, D.BatchShape(accum=2, global_batch=6, seq=16)
    s = stream(small_dirs[0], shape, seed=3)
    corpus = s.corpora[0]
    table, n = window_index(corpus, seq)
    per_step = shape.accum * shape.global_batch
    steps = (3 * n) // per_step + 1
    seen = [
        table[r.tobytes()]
        for k in range(1, steps + 1)
        for r in s.rows(k, 0, 6).reshape(-1, seq + 1)
    ]
    epochs = [seen[e * n : (e + 1) * n] for e in range(3)]
    for e in epochs:
        assert sorted(e) == list(range(n))
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled each epoch
    assert s.epochs(steps) == [pytest.approx(steps * per_step / n)]


def test_two_process_resume_mid_epoch_reads_identical_batches(small_dirs):
    """Two processes (rows 0:3 and 3:6), stopped after step 20 (mid-epoch) and reopened, read
    byte for byte the batches of one uninterrupted process; so does one process resuming."""
    shape = D.BatchShape(accum=1, global_batch=6, seq=16)
    kw = dict(seed=9, document_mask=True)
    whole = stream(small_dirs[0], shape, **kw)
    n = whole.windows[0]
    assert 20 * 6 < n < 40 * 6  # step 20 ends inside the first epoch, step 40 is in the second
    ref = [whole.batch(k, 0, 6) for k in range(1, 41)]
    halves = [(0, 3), (3, 6)]
    procs = [stream(small_dirs[0], shape, **kw) for _ in halves]
    got = [
        [p.batch(k, lo, hi) for k in range(1, 21)]
        for p, (lo, hi) in zip(procs, halves, strict=True)
    ]
    procs = [stream(small_dirs[0], shape, **kw) for _ in halves]  # the resumed processes
    for p, (lo, hi), g in zip(procs, halves, got, strict=True):
        g += [p.batch(k, lo, hi) for k in range(21, 41)]
    one = stream(small_dirs[0], shape, **kw)  # or resumed on one process
    for k in range(40):
        tokens = np.concatenate([got[0][k][0], got[1][k][0]], axis=1)
        segs = np.concatenate([got[0][k][1], got[1][k][1]], axis=1)
        assert tokens.tobytes() == ref[k][0].tobytes() and segs.tobytes() == ref[k][1].tobytes()
        if k >= 20:
            assert one.batch(k + 1, 0, 6)[0].tobytes() == ref[k][0].tobytes()
    assert np.any(np.concatenate([r[1] for r in ref]) > 0)  # the windows do cross documents


def test_segments_follow_document_boundaries(small_dirs):
    corpus = D.open_corpus(small_dirs[0])
    ends = corpus.doc_ends
    assert corpus.num_documents == 12 and ends[-1] == corpus.num_tokens
    start = int(ends[2]) - 5  # five tokens of document 3, then document 4 ...
    seg = corpus.segments(start, 40)
    assert seg[:5].tolist() == [0] * 5 and seg[5] == 1 and seg.dtype == np.int32
    assert (
        np.all(np.diff(seg) >= 0) and seg[-1] == np.searchsorted(ends, start + 39, side="right") - 2
    )
    # A window across a shard boundary reads the same tokens as the shards end to end.
    flat = np.concatenate([np.asarray(s) for s in corpus.shards])
    assert len(corpus.shards) > 1
    at = len(corpus.shards[0]) - 7
    np.testing.assert_array_equal(corpus.read(at, 20), flat[at : at + 20])


def test_mixture_deals_by_weight_and_keeps_each_dataset_in_epochs(small_dirs):
    shape = D.BatchShape(accum=1, global_batch=64, seq=16)
    cfg = DataConfig(source="tokens", mixture=f"{small_dirs[0]}=2,{small_dirs[1]}=1")
    mix = D.open_stream(cfg, shape, seed=0, vocab_size=256)
    assert mix.counts.tolist() == [2731, 1365]  # of 2730.67 and 1365.33, the larger remainder
    p = np.arange(2 * D.loader.MIX_BLOCK)
    d, w = mix.locate(p)
    assert np.bincount(d[: D.loader.MIX_BLOCK]).tolist() == [2731, 1365]  # exact shares per block
    _, q = mix._deal(p)
    for c in (0, 1):
        n, mine = mix.windows[c], d[: D.loader.MIX_BLOCK] == c
        # The dataset numbers its own sequences 0, 1, ... and each run of n of them is one epoch.
        assert sorted(q[: D.loader.MIX_BLOCK][mine].tolist()) == list(range(mix.counts[c]))
        for e in range(mix.counts[c] // n):
            assert sorted(w[(d == c) & (q // n == e)].tolist()) == list(range(n))
        # So no window is drawn more than once more than any other.
        hits = np.bincount(w[: D.loader.MIX_BLOCK][mine], minlength=n)
        assert hits.max() - hits.min() <= 1
    # Rows really come from the dataset `locate` names.
    tokens, _ = mix.batch(1, 0, 64)
    tables = [window_index(c, 16)[0] for c in mix.corpora]
    for row, c, win in zip(tokens[0], d[:64], w[:64], strict=True):
        assert tables[c][row.tobytes()] == win
    e = mix.epochs(2)
    assert e[0] == pytest.approx(np.sum(d[:128] == 0) / mix.windows[0])
    with pytest.raises(TieraxError, match="not PATH=WEIGHT with a positive weight"):
        DataConfig(source="tokens", mixture=f"{small_dirs[0]}=-1")
    with pytest.raises(TieraxError, match="below 1/4096 of the total"):
        D.loader.mixture_counts([1.0, 1e-6])


def test_permutation_is_a_bijection_for_every_size():
    for n in [1, 2, 3, 7, 64, 65, 1000, 4097]:
        p = permute(np.arange(n), n, round_keys([5, n]))
        assert sorted(p.tolist()) == list(range(n))
    a = permute(np.arange(1000), 1000, round_keys([1]))
    assert not np.array_equal(a, np.arange(1000)) and not np.array_equal(
        a, permute(np.arange(1000), 1000, round_keys([2]))
    )


def test_validation_batches_are_fixed_and_in_order(tmp_path):
    src = tmp_path / "d.jsonl"
    lines = [ln for ln in SAMPLE.read_text().splitlines() if ln.strip()]
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    D.prepare([src], tmp_path / "tok", validation_fraction=0.2)
    cfg = DataConfig(
        source="tokens", path=str(tmp_path / "tok"), validation_every=5, validation_batches=3
    )
    v = D.open_validation(cfg, 4, 32, vocab_size=256)
    corpus = D.open_corpus(tmp_path / "tok", split="validation")
    b1 = v.batch(1, 0, 4)[0]
    np.testing.assert_array_equal(b1[2], corpus.read((1 * 4 + 2) * 32, 33))
    np.testing.assert_array_equal(v.batch(1, 2, 4)[0], b1[2:])
    with pytest.raises(TieraxError, match="fewer than data.validation_batches × global batch"):
        D.open_validation(
            DataConfig(
                source="tokens",
                path=str(tmp_path / "tok"),
                validation_every=1,
                validation_batches=10_000,
            ),
            4,
            32,
            vocab_size=256,
        )
    D.prepare_text(SAMPLE, tmp_path / "plain")
    with pytest.raises(TieraxError, match="has no validation split"):
        D.open_validation(
            DataConfig(source="tokens", path=str(tmp_path / "plain"), validation_every=1),
            4,
            32,
            vocab_size=256,
        )


def test_synthetic_rows_are_per_row_deterministic():
    s = D.SyntheticStream(D.BatchShape(1, 8, 16), seed=0, vocab_size=100)
    full = s.rows(3, 0, 8)
    np.testing.assert_array_equal(full[:, 2:5], s.rows(3, 2, 5))
    assert full.max() < 100 and not np.array_equal(full, s.rows(4, 0, 8))


def test_local_rows_cover_the_batch_on_one_process():
    mesh = make_mesh(2, 4)
    assert D.local_rows(NamedSharding(mesh, P(BATCH_AXES)), (16, 33), axis=0) == (0, 16)
    assert D.local_rows(NamedSharding(mesh, P(None, BATCH_AXES)), (2, 16, 33), axis=1) == (0, 16)


def test_jax_sees_the_same_batch_it_was_given(token_dir):
    mesh = make_mesh(1, 8)
    local = stream(token_dir, D.BatchShape(1, 8, 16)).rows(1, 0, 8)[0]
    arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P(BATCH_AXES)), local, (8, 17))
    np.testing.assert_array_equal(np.asarray(arr), local)


def test_bad_data_is_a_clear_error(token_dir, tmp_path):
    shape = D.BatchShape(1, 2, 16)
    with pytest.raises(TieraxError, match="does not exist; prepare one with `tierax data prepare"):
        stream(tmp_path / "nope", shape)
    with pytest.raises(TieraxError, match="has no index.json"):
        stream(tmp_path, shape)
    with pytest.raises(TieraxError, match="vocab_size is 128; use a model with vocab_size ≥ 256"):
        D.open_stream(
            DataConfig(source="tokens", path=str(token_dir)), shape, seed=0, vocab_size=128
        )
    with pytest.raises(TieraxError, match="fewer than one sequence"):
        stream(token_dir, D.BatchShape(1, 2, 200_000))
    cut = tmp_path / "cut"
    D.prepare_text(SAMPLE, cut)
    (cut / D.shard_name("train", 0)).write_bytes(b"abc")  # a shard that does not match its index
    with pytest.raises(TieraxError, match="missing or not 99012 bytes"):
        D.open_corpus(cut)


def test_first_format_directories_still_read(tmp_path):
    """A directory written before format 2 (tokens.bin + the old index) trains as before."""
    raw = SAMPLE.read_bytes()
    (tmp_path / "tokens.bin").write_bytes(raw)
    import hashlib

    (tmp_path / "index.json").write_text(
        json.dumps(
            {
                "num_tokens": len(raw),
                "dtype": "uint8",
                "tokenizer": "bytes",
                "vocab_size": 256,
                "source": str(SAMPLE),
                "source_sha256": hashlib.sha256(raw).hexdigest(),
                "format": "tierax.tokens/1",
            }
        )
    )
    c = D.open_corpus(tmp_path)
    assert (
        c.num_tokens == len(raw)
        and c.read(0, 5).tobytes() == np.frombuffer(raw[:5], np.uint8).astype(np.int32).tobytes()
    )
    (tmp_path / "tokens.bin").write_bytes(raw[:-1] + b"?")
    with pytest.raises(TieraxError, match="checksum mismatch"):
        D.open_corpus(tmp_path)


# --- other tools' token files -------------------------------------------------------------


def write_megatron(prefix: pathlib.Path, docs: list[list[list[int]]], dtype="uint16") -> None:
    """A Megatron-LM ``IndexedDataset`` pair, written from its format as Megatron's ``_IndexWriter``
    lays it out (header, version 1, dtype code, counts, sizes int32, pointers int64, document index
    int64): documents of one or more sequences."""
    code = {"uint16": 8, "int32": 4}[dtype]
    seqs = [s for d in docs for s in d]
    sizes = np.array([len(s) for s in seqs], np.int32)
    pointers = (
        np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) * np.dtype(dtype).itemsize
    )
    doc_idx = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    prefix.with_suffix(".bin").write_bytes(np.concatenate(seqs).astype(dtype).tobytes())
    with open(prefix.with_suffix(".idx"), "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code))
        f.write(struct.pack("<Q", len(seqs)) + struct.pack("<Q", len(doc_idx)))
        f.write(sizes.tobytes() + pointers.tobytes() + doc_idx.tobytes())


def test_megatron_dataset_reads_tokens_and_document_boundaries(tmp_path):
    rng = np.random.default_rng(0)
    docs = [
        [rng.integers(0, 500, n).tolist() for n in lens] for lens in ([40, 7], [25], [3, 3, 60])
    ]
    write_megatron(tmp_path / "corpus_text_document", docs)
    for given in ("corpus_text_document", "corpus_text_document.bin", "corpus_text_document.idx"):
        c = D.open_corpus(tmp_path / given)
        flat = [t for d in docs for s in d for t in s]
        assert c.num_tokens == len(flat) and c.read(0, len(flat)).tolist() == flat
        assert c.doc_ends.tolist() == [47, 72, 138] and c.vocab_size == max(flat) + 1
    shape = D.BatchShape(1, 2, 16)
    s = D.open_stream(
        DataConfig(
            source="tokens", path=str(tmp_path / "corpus_text_document"), document_mask=True
        ),
        shape,
        seed=0,
        vocab_size=512,
    )
    tokens, segs = s.batch(1, 0, 2)
    assert tokens.shape == segs.shape == (1, 2, 17)
    with pytest.raises(
        TieraxError, match=f"has token ids up to {max(flat)} but the model's vocab_size is 256"
    ):
        D.open_stream(
            DataConfig(source="tokens", path=str(tmp_path / "corpus_text_document")),
            shape,
            seed=0,
            vocab_size=256,
        )
    idx = tmp_path / "corpus_text_document.idx"
    idx.write_bytes(idx.read_bytes()[:-8])
    with pytest.raises(TieraxError, match="not an intact Megatron index"):
        D.open_corpus(tmp_path / "corpus_text_document")


def test_flat_arrays_npy_and_raw_bin(tmp_path):
    ids = np.random.default_rng(1).integers(0, 70_000, 5000).astype(np.uint32)
    np.save(tmp_path / "t.npy", ids)
    ids.tofile(tmp_path / "t.bin")
    a = D.open_corpus(tmp_path / "t.npy")
    b = D.open_corpus(tmp_path / "t.bin", dtype="uint32")
    assert a.read(100, 50).tolist() == b.read(100, 50).tolist() == ids[100:150].tolist()
    assert a.doc_ends is None and a.vocab_size == int(ids.max()) + 1
    assert a.identity["sha256"] == b.identity["sha256"]  # the same bytes, whatever the container
    with pytest.raises(TieraxError, match="give its dtype with data.dtype"):
        D.open_corpus(tmp_path / "t.bin")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    with pytest.raises(TieraxError, match="not a whole number of uint16 ids"):
        D.open_corpus(tmp_path / "odd.bin", dtype="uint16")
    np.save(tmp_path / "f.npy", np.zeros((2, 3), np.float32))
    with pytest.raises(TieraxError, match="a token file is a 1-D integer array"):
        D.open_corpus(tmp_path / "f.npy")
