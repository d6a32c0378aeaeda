"""The data pipeline's edges, against hand computation and brute force: token dtypes and the
vocabulary check at their limits, the mixture's and the epochs' sequence numbers (every sequence
dealt exactly once), oversize documents, and the prepared directory's integrity check."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from tierax.errors import TieraxError
from tierax.train.data import loader as L
from tierax.train.data import pipeline, prepared
from tierax.train.data.corpus import Corpus
from tierax.train.data.streams import check_vocab
from tierax.train.data.tokenizer import token_dtype


@pytest.mark.parametrize(
    "vocab, dtype",
    [(256, "uint8"), (257, "uint16"), (65536, "uint16"), (65537, "uint32"), (2**32, "uint32")],
)
def test_token_dtype_is_the_narrowest_that_holds_every_id(vocab, dtype):
    assert token_dtype(vocab) == dtype
    assert np.iinfo(dtype).max >= vocab - 1


def test_a_vocabulary_too_large_for_32_bit_ids_is_refused():
    with pytest.raises(TieraxError, match="does not fit in 32-bit"):
        token_dtype(2**32 + 1)


def _corpus(tokens, vocab, name="c") -> Corpus:
    tokens = np.asarray(tokens, np.uint16)
    return Corpus(name, [tokens], None, vocab, {"name": name})


def test_the_vocabulary_check_admits_ids_below_vocab_size_only():
    check_vocab(_corpus([0, 255], 256), 256)  # ids 0 … 255: a vocabulary of 256 fits 256
    check_vocab(_corpus([0, 255], 256), 300)
    with pytest.raises(TieraxError, match=r"token ids up to 256 .* vocab_size is 256.*≥ 257"):
        check_vocab(_corpus([0, 256], 257), 256)


def test_sequence_numbers_of_a_step_by_hand():
    shape = L.BatchShape(accum=2, global_batch=4, seq=8)
    one = L.EpochLoader([_corpus(np.arange(200) % 50, 50)], shape, seed=0)
    # step 3, rows 1:3: microsteps 4 and 5 of the run, 4 sequences each.
    assert one.sequence_numbers(3, 1, 3).tolist() == [[17, 18], [21, 22]]
    assert one.sequence_numbers(1, 0, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_mixture_deals_each_corpus_its_count_per_block_each_sequence_once():
    shape = L.BatchShape(accum=1, global_batch=8, seq=4)
    corpora = [_corpus(np.arange(400) % 7, 7, "a"), _corpus(np.arange(800) % 7, 7, "b")]
    mix = L.EpochLoader(corpora, shape, seed=3, weights=[1.0, 3.0])
    assert mix.counts.tolist() == [L.MIX_BLOCK // 4, 3 * L.MIX_BLOCK // 4]
    blocks = 3
    d, q = mix._deal(np.arange(blocks * L.MIX_BLOCK))
    for c in (0, 1):
        own = np.sort(q[d == c])
        # brute force: corpus c's own sequence numbers are 0 … blocks·count − 1, each once
        assert own.tolist() == list(range(blocks * int(mix.counts[c])))
    # each block holds exactly its counts
    for b in range(blocks):
        sel = d[b * L.MIX_BLOCK : (b + 1) * L.MIX_BLOCK]
        assert np.bincount(sel, minlength=2).tolist() == mix.counts.tolist()


def test_every_window_once_per_epoch():
    shape = L.BatchShape(accum=1, global_batch=2, seq=4)
    c = _corpus(np.arange(41) % 9, 9)  # 41 tokens: (41 − 1) // 4 = 10 windows of 4 + 1 tokens
    one = L.EpochLoader([c], shape, seed=5)
    n = one.windows[0]
    assert n == 10
    _, w = one.locate(np.arange(3 * n))
    for e in range(3):
        assert sorted(w[e * n : (e + 1) * n].tolist()) == list(range(n))


@pytest.mark.parametrize(
    "weights, block, counts",
    [([1, 1, 1], 100, [34, 33, 33]), ([2, 1], 9, [6, 3]), ([1, 2, 2], 10, [2, 4, 4])],
)
def test_mixture_counts_by_largest_remainder(weights, block, counts):
    assert L.mixture_counts(weights, block).tolist() == counts


def test_a_document_at_the_limit_is_taken_and_one_byte_more_refused(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_bytes(b"x" * 1000)
    pipeline.prepare([doc], tmp_path / "ok", max_document_bytes=1000)
    assert prepared.open_prepared(tmp_path / "ok").num_tokens == 1000
    with pytest.raises(TieraxError, match="more than the limit of 999"):
        pipeline.prepare([doc], tmp_path / "no", max_document_bytes=999)
    assert not (tmp_path / "no").exists()  # nothing half-written


def _prepared(tmp_path) -> pathlib.Path:
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(30)))
    out = tmp_path / "tokens"
    pipeline.prepare([docs], out, shard_tokens=1000)
    return out


def test_a_changed_byte_in_a_shard_fails_the_checksum_and_a_short_file_its_size(tmp_path):
    out = _prepared(tmp_path)
    index = json.loads((out / "index.json").read_text())
    shards = index["splits"]["train"]["shards"]
    assert len(shards) >= 2
    good = prepared.open_prepared(out)
    f = out / shards[1]["file"]
    data = bytearray(f.read_bytes())
    data[5] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(TieraxError, match=rf"{shards[1]['file']}: checksum mismatch"):
        prepared.open_prepared(out)
    # without verification only the sizes are checked: it opens, with the changed token
    changed = prepared.open_prepared(out, verify=False)
    assert changed.num_tokens == good.num_tokens
    f.write_bytes(bytes(data[:-1]))
    with pytest.raises(TieraxError, match="missing or not"):
        prepared.open_prepared(out, verify=False)


def test_a_changed_document_file_fails_the_checksum(tmp_path):
    out = _prepared(tmp_path)
    index = json.loads((out / "index.json").read_text())
    f = out / index["splits"]["train"]["documents"]["file"]
    ends = np.fromfile(f, "<i8")
    ends[0] += 1
    ends.tofile(f)
    with pytest.raises(TieraxError, match="checksum mismatch"):
        prepared.open_prepared(out)


def test_a_hugging_face_tokenizers_vocabulary_counts_its_added_tokens(tmp_path):
    pytest.importorskip("tokenizers")
    import tokenizer_files as TF
    from tokenizers import Tokenizer

    from tierax.train.data.tokenizer import load_tokenizer

    path = TF.hf_bpe(tmp_path)
    tok = Tokenizer.from_file(str(path))
    tok.add_special_tokens(["<|extra_0|>", "<|extra_1|>"])  # after training: ids past the model's
    tok.save(str(path))
    ids = tok.get_vocab(with_added_tokens=True).values()
    info = load_tokenizer(path).info
    assert info.vocab_size == max(ids) + 1 == len(set(ids))  # brute force over every id
    extra = tok.token_to_id("<|extra_1|>")
    assert extra == info.vocab_size - 1
    assert token_dtype(info.vocab_size) == ("uint8" if info.vocab_size <= 256 else "uint16")
