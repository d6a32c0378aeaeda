"""Small tokenizers of every kind tierax reads, built on the fly from data/sample.txt (no download).

* a byte-level BPE ``tokenizer.json`` trained by the ``tokenizers`` package, with Llama 3's
  special tokens and a post-processor that puts ``<|begin_of_text|>`` in front;
* a SentencePiece BPE model trained by ``sentencepiece`` with Llama 2's settings (byte
  fallback, identity normalisation, BOS 1, EOS 2);
* a tiktoken BPE file written in its base64 format from the BPE's merges (the 256 bytes, then
  each merge's bytes in merge order: GPT-2's vocabulary as tiktoken stores it).
"""

import base64
import json
import pathlib

SAMPLE = pathlib.Path(__file__).parent.parent / "data" / "sample.txt"
BPE_VOCAB = 1000


def paragraphs() -> list[str]:
    """The sample text's non-blank lines (paragraphs), the documents of the JSONL tests."""
    return [line for line in SAMPLE.read_text().splitlines() if line.strip()]


def hf_bpe(directory: pathlib.Path, *, with_bos: bool = True) -> pathlib.Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([str(SAMPLE)], trainer)
    if with_bos:
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", bos)],
        )
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "tokenizer.json"
    tok.save(str(out))
    return out


def sentencepiece_model(directory: pathlib.Path, vocab: int = 800) -> pathlib.Path:
    import sentencepiece as spm

    directory.mkdir(parents=True, exist_ok=True)
    prefix = directory / "sp"
    spm.SentencePieceTrainer.train(
        input=str(SAMPLE),
        model_prefix=str(prefix),
        vocab_size=vocab,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        max_sentence_length=1 << 16,
        num_threads=1,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def tiktoken_file(directory: pathlib.Path) -> pathlib.Path:
    """Llama 3's format: ``BASE64 RANK`` lines, the byte alphabet first, then the BPE's merges."""
    spec = json.loads(hf_bpe(directory / "hf-for-tiktoken", with_bos=False).read_text())
    # GPT-2's byte ↔ printable-character table, as the ByteLevel pre-tokenizer uses it.
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    )
    chars, n = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    to_byte = {chr(c): b for b, c in zip(printable, chars, strict=True)}
    ranks = {bytes([b]): b for b in range(256)}
    for merge in spec["model"]["merges"]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        token = bytes(to_byte[ch] for ch in left + right)
        ranks.setdefault(token, len(ranks))
    out = directory / "tokenizer.model"
    out.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    return out
