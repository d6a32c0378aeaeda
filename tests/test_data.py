"""Token files, deterministic batches, per-process rows."""

import hashlib
import json
import pathlib

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from tierax.errors import TieraxError
from tierax.train import data as D
from tierax.mesh import BATCH_AXES, make_mesh
from test_cli import tierax

SAMPLE = pathlib.Path(__file__).parent.parent / "data" / "sample.txt"


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens")
    D.prepare_text(SAMPLE, out)
    return out


def test_prepare_writes_bytes_and_an_index(token_dir):
    raw = SAMPLE.read_bytes()
    index = json.loads((token_dir / D.INDEX).read_text())
    assert index["num_tokens"] == len(raw) > 90_000
    assert index["tokenizer"] == "bytes" and index["vocab_size"] == 256 and index["dtype"] == "uint8"
    assert index["source_sha256"] == hashlib.sha256(raw).hexdigest()
    assert (token_dir / D.TOKENS).read_bytes() == raw  # byte-level: token ids are the bytes
    assert sorted(p.name for p in token_dir.iterdir()) == [D.INDEX, D.TOKENS]  # no temporaries left


def test_batches_are_a_function_of_seed_and_step(token_dir):
    shape = D.BatchShape(accum=2, global_batch=8, seq=32)
    a = D.TokenStream(token_dir, shape, seed=1, vocab_size=256)
    b = D.TokenStream(token_dir, shape, seed=1, vocab_size=256)
    full = a.rows(7, 0, 8)
    assert full.shape == (2, 8, 33) and full.dtype == np.int32
    np.testing.assert_array_equal(full, b.rows(7, 0, 8))
    # A process holding rows 4:8 reads exactly those rows of the same global batch.
    np.testing.assert_array_equal(full[:, 4:8], b.rows(7, 4, 8))
    assert not np.array_equal(full, a.rows(8, 0, 8))
    assert not np.array_equal(full, D.TokenStream(token_dir, shape, seed=2, vocab_size=256).rows(7, 0, 8))
    # Every row is a contiguous window of the text.
    text = np.frombuffer(SAMPLE.read_bytes(), np.uint8)
    row = full[1, 3]
    starts = np.flatnonzero(text[: len(text) - 32] == row[0])
    assert any(np.array_equal(text[s : s + 33], row) for s in starts)


def test_synthetic_rows_are_per_row_deterministic():
    s = D.SyntheticStream(D.BatchShape(1, 8, 16), seed=0, vocab_size=100)
    full = s.rows(3, 0, 8)
    np.testing.assert_array_equal(full[:, 2:5], s.rows(3, 2, 5))
    assert full.max() < 100 and not np.array_equal(full, s.rows(4, 0, 8))


def test_local_rows_cover_the_batch_on_one_process():
    mesh = make_mesh(2, 4)
    assert D.local_rows(NamedSharding(mesh, P(BATCH_AXES)), (16, 33), axis=0) == (0, 16)
    assert D.local_rows(NamedSharding(mesh, P(None, BATCH_AXES)), (2, 16, 33), axis=1) == (0, 16)


def test_bad_data_is_a_clear_error(token_dir, tmp_path):
    shape = D.BatchShape(1, 2, 16)
    with pytest.raises(TieraxError, match="does not exist; prepare one with `tierax data prepare"):
        D.TokenStream(tmp_path / "nope", shape, seed=0, vocab_size=256)
    with pytest.raises(TieraxError, match="has no index.json"):
        D.TokenStream(tmp_path, shape, seed=0, vocab_size=256)
    with pytest.raises(TieraxError, match="vocab_size is 128; use a model with vocab_size ≥ 256"):
        D.TokenStream(token_dir, shape, seed=0, vocab_size=128)
    with pytest.raises(TieraxError, match="fewer than one sequence"):
        D.TokenStream(token_dir, D.BatchShape(1, 2, 200_000), seed=0, vocab_size=256)
    cut = tmp_path / "cut"
    D.prepare_text(SAMPLE, cut)
    (cut / D.TOKENS).write_bytes(b"abc")  # a token file that does not match its index
    with pytest.raises(TieraxError, match="missing or not"):
        D.read_index(cut)
    with pytest.raises(TieraxError, match="does not exist"):
        D.prepare_text(tmp_path / "missing.txt", tmp_path / "out")


def test_cli_prepare_and_missing_text(tmp_path):
    ok = tierax("data", "prepare", str(SAMPLE), "--out", str(tmp_path / "d"))
    assert ok.returncode == 0, ok.stderr
    assert "99,012 tokens" in ok.stdout or f"{SAMPLE.stat().st_size:,} tokens" in ok.stdout
    bad = tierax("data", "prepare", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "e"))
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "e").exists()


def test_jax_sees_the_same_batch_it_was_given(token_dir):
    # make_array_from_process_local_data with all rows local reproduces the global batch.
    mesh = make_mesh(1, 8)
    stream = D.TokenStream(token_dir, D.BatchShape(1, 8, 16), seed=0, vocab_size=256)
    local = stream.rows(1, 0, 8)[0]
    arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P(BATCH_AXES)), local, (8, 17))
    np.testing.assert_array_equal(np.asarray(arr), local)
