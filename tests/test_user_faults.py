"""Faults a new user hit (issue 40, items 1-13), each run the way the user ran it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tierax.tracing.model_program import for_inventory


def _python(code: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"},
    )


def _tierax(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return _python("import sys; from tierax.cli import main; sys.exit(main())", *args, cwd=cwd)


# -- 1: the solver's C++ output never reaches stdout -------------------------------------------

# HiGHS' log, switched on (disp=True), is written by the C++ library straight to fd 1 -- the same
# path as the chatter the user saw -- so every solve here prints real native output.
_LOUD_HIGHS = """
    import sys
    import scipy.optimize
    real = scipy.optimize.milp
    def loud(*a, **k):
        k["options"] = {**(k.get("options") or {}), "disp": True}
        return real(*a, **k)
    scipy.optimize.milp = loud
    from tierax.cli import main
    sys.exit(main())
"""


def test_plan_json_is_one_document_while_highs_writes_to_fd1():
    from gpu_budget import fixed_bytes

    # 21 MiB for the model's own buffers beside XLA:GPU's fixed bytes (by jaxlib release; 25 MiB
    # in all when those were 4 MiB): a budget the segmented plan solves within
    budget = str((fixed_bytes("h200") + 21 * 2**20) / 2**30)
    args = ["plan", "--model", "tiny-llama", "--set", "num_layers=6", "--microbatch", "8"]
    r = _python(_LOUD_HIGHS, *args, "--seq", "64", "--budget-gib", budget, "--segments", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # exactly one JSON document: nothing before or after it
    assert doc["plan"]["groups"]["decoder"]["segments"]
    assert "HiGHS" in r.stderr or "Running HiGHS" in r.stderr  # the log went to stderr instead


# -- 2: a gzip-compressed Parquet file is read as Parquet ------------------------------------


def test_gzip_compressed_parquet_is_read_as_parquet(tmp_path):
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tierax.train import data as D

    texts = [f"document number {i}: " + "words " * (i % 7) for i in range(50)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "docs.parquet", row_group_size=16)
    raw = (tmp_path / "docs.parquet").read_bytes()
    (tmp_path / "docs.parquet.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "anyname.gz").write_bytes(gzip.compress(raw))  # told by the PAR1 payload
    ref = D.prepare([tmp_path / "docs.parquet"], tmp_path / "p")
    # Byte-level by hand: every document's UTF-8 bytes, one document per row.
    assert ref["splits"]["train"]["num_documents"] == len(texts)
    r = _tierax("data", "prepare", str(tmp_path / "docs.parquet.gz"), "--out", str(tmp_path / "g"))
    assert r.returncode == 0, r.stderr
    gz = json.loads((tmp_path / "g" / "index.json").read_text())
    assert gz["splits"]["train"]["num_documents"] == len(texts)
    assert gz["splits"]["train"]["num_tokens"] == ref["splits"]["train"]["num_tokens"]
    ref_bin = (tmp_path / "p" / "train-00000.bin").read_bytes()
    assert (tmp_path / "g" / "train-00000.bin").read_bytes() == ref_bin
    assert b"PAR1" not in ref_bin and texts[3].encode() in ref_bin
    D.prepare([tmp_path / "anyname.gz"], tmp_path / "a")
    assert (tmp_path / "a" / "train-00000.bin").read_bytes() == ref_bin


# -- 3 and 8: plot-metrics on records without throughput; its --out ---------------------------


def _metrics_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "loss": 5.0 - 0.1 * s} for s in range(1, 11)]  # no tokens_per_s at all
    rows[4]["tflops_per_device"] = 1.5
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_plot_metrics_draws_what_the_records_have_and_says_what_is_missing(tmp_path):
    run = _metrics_run(tmp_path)
    r = _tierax("plot-metrics", str(run))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert "10 of 10 step records have no 'tokens_per_s'; its curve is not drawn" in r.stderr
    assert "9 of 10 step records have no 'tflops_per_device'" in r.stderr
    png = (run / "metrics.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    # Records with nothing to draw: refused, exit 2, nothing written.
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    r = _tierax("plot-metrics", str(run), "--out", str(tmp_path / "none.png"))
    assert r.returncode == 2 and "no record has any of loss, tokens_per_s" in r.stderr
    assert not (tmp_path / "none.png").exists()


def test_plot_metrics_out_is_png_only_and_replaces_only_its_own_file(tmp_path):
    run = _metrics_run(tmp_path)
    for name in ("x.txt", "x.jpg"):
        r = _tierax("plot-metrics", str(run), "--out", str(tmp_path / name))
        assert r.returncode == 2 and "PNG only" in r.stderr and ".png" in r.stderr, r.stderr
        assert not (tmp_path / name).exists()
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"the user's own picture")
    r = _tierax("plot-metrics", str(run), "--out", str(mine))
    assert r.returncode == 2 and "--force" in r.stderr and "not replaced" in r.stderr
    assert mine.read_bytes() == b"the user's own picture"
    r = _tierax("plot-metrics", str(run), "--out", str(mine), "--force")
    assert r.returncode == 0, r.stderr
    first = mine.read_bytes()
    assert first.startswith(b"\x89PNG")
    # A plot tierax wrote is replaced without --force.
    r = _tierax("plot-metrics", str(run), "--out", str(mine))
    assert r.returncode == 0, r.stderr


def _main(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    """``tierax ARGS`` in this process (faster than a subprocess): (exit code, stdout, stderr)."""
    from tierax import cli

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    code = cli.main(list(args))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_plan_out_replaces_only_what_tierax_plan_wrote(tmp_path, monkeypatch, capsys):
    base = ["plan", "--model", "tiny-llama", "--microbatch", "2", "--seq", "64"]
    notes = tmp_path / "notes.yaml"
    notes.write_text("my: own notes\n")
    for extra in ([], ["--emit", "maxtext"]):
        code, _, err = _main(monkeypatch, capsys, *base, *extra, "--out", str(notes))
        assert code == 2, err
        assert "exists and is not a plan or MaxText overrides file" in err and "--force" in err
        assert notes.read_text() == "my: own notes\n"
    out = tmp_path / "plan.yaml"
    assert _main(monkeypatch, capsys, *base, "--out", str(out))[0] == 0
    assert "groups:" in out.read_text()
    # What tierax plan wrote is replaced, by a plan or by MaxText overrides, and back.
    assert _main(monkeypatch, capsys, *base, "--emit", "maxtext", "--out", str(out))[0] == 0
    assert "# MaxText overrides written by tierax" in out.read_text()
    assert _main(monkeypatch, capsys, *base, "--out", str(out))[0] == 0
    assert "groups:" in out.read_text()
    assert _main(monkeypatch, capsys, *base, "--out", str(notes), "--force")[0] == 0
    assert "groups:" in notes.read_text()


# -- 5: plan --max-microbatch searches past 4096 and says when its guard stops it -----------


def test_max_microbatch_is_not_capped_at_4096(monkeypatch, capsys):
    from tierax import costmodel as cm
    from tierax.errors import TieraxError
    from tierax.models import get_config
    from tierax.solving import planner
    from tierax.tracing.inventory import model_inventory

    budget = 3 * 2**30
    code, out, err = _main(
        monkeypatch, capsys, "plan", "--model", "tiny-llama", "--target", "h100", "--seq", "64",
        "--max-microbatch", "--budget-gib", "3", "--json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    mb = doc["microbatch"]
    assert mb > 4096 and "search_stopped_at" not in doc
    found = f"largest microbatch that fits: {mb:,} per device ({mb + 1:,} does not)"
    assert doc["notes"] == [found]  # no "at least": the search found where fitting stops
    # The boundary, checked on the traced inventories either side (not the search's extrapolation).
    cfg = get_config("tiny-llama")
    rates = cm.target_rates("h100", cfg.dtype)
    planner.plan(for_inventory(cfg, model_inventory(cfg, mb, 64)), rates, budget_bytes=budget)
    with pytest.raises(TieraxError):
        planner.plan(
            for_inventory(cfg, model_inventory(cfg, mb + 1, 64)), rates, budget_bytes=budget
        )


def test_max_microbatch_reaching_the_guard_says_at_least(monkeypatch, capsys):
    from tierax.solving import planner

    monkeypatch.setattr(planner, "MAX_MICROBATCH_SEARCH", 48)  # tiny-llama fits far more
    code, out, err = _main(
        monkeypatch, capsys, "plan", "--model", "tiny-llama", "--seq", "64", "--max-microbatch",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["microbatch"] == 48 and doc["search_stopped_at"] == 48
    assert doc["notes"] == [
        "largest microbatch that fits: at least 48; the search stops at 48 (a larger one may fit "
        "too)"
    ]


# -- 6: the examples run as documented and print errors in one line ---------------------------

EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples"


def _example(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.slow  # the example run twice
def test_jax_scan_example_runs_its_documented_budget_and_refuses_a_small_one_in_one_line():
    import re

    doc = (EXAMPLES / "jax_scan_model.py").read_text()
    (mib,) = re.findall(r"--budget-mib (\d+)\]", doc)  # the usage its docstring documents
    ok = _example("jax_scan_model.py", "--budget-mib", mib)
    assert ok.returncode == 0, ok.stderr
    assert "gradients vs no remat" in ok.stdout
    bad = _example("jax_scan_model.py", "--budget-mib", "24")  # below what remat-all needs
    assert bad.returncode == 2, bad.stderr
    assert "Traceback" not in bad.stderr
    (line,) = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert "error: no plan fits" in line and "a larger budget=" in line


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flax_linen_model.py"])
def test_examples_print_a_bad_budget_in_one_line(name):
    bad = _example(name, "--budget-mib", "0.01")
    assert bad.returncode == 2, bad.stderr
    (line,) = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert line.startswith(str(EXAMPLES / name) + ": error: no plan fits"), line


# -- 4 and 10: mixtures and validation data of other tokenizers / the training data itself ------


@pytest.fixture(scope="module")
def token_dirs(tmp_path_factory):
    """Token directories of one sample text: byte-level (with a validation split, and a copy of
    it elsewhere), and two different BPE tokenizer files of the same kind."""
    import shutil

    import tokenizer_files as TF

    from tierax.train import data as D

    d = tmp_path_factory.mktemp("tokens")
    docs = d / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TF.paragraphs()))
    hf_a, hf_b = TF.hf_bpe(d / "hf-a"), TF.hf_bpe(d / "hf-b", with_bos=False)
    D.prepare([docs], d / "bytes", validation_fraction=0.2)
    shutil.copytree(d / "bytes", d / "bytes-copy")
    D.prepare([docs], d / "bytes-train-only")  # no validation split: all of it is train
    D.prepare([docs], d / "bpe-a", tokenizer=str(hf_a))
    D.prepare([docs], d / "bpe-b", tokenizer=str(hf_b))
    return d


def _data(**kw):
    from tierax.train.sections import DataConfig

    return DataConfig(source="tokens", **kw)


def test_a_mixture_of_different_tokenizers_is_refused_naming_both(token_dirs):
    from tierax.errors import TieraxError
    from tierax.train import data as D

    shape = D.BatchShape(1, 2, 16)
    d = token_dirs
    for a, b, kinds in [
        ("bytes", "bpe-a", ("bytes tokenizer", "huggingface tokenizer")),
        ("bpe-a", "bpe-b", ("huggingface tokenizer, SHA-256", "huggingface tokenizer, SHA-256")),
    ]:
        with pytest.raises(TieraxError) as e:
            D.open_stream(_data(mixture=f"{d / a}=0.5,{d / b}=0.5"), shape, seed=0, vocab_size=2000)
        msg = str(e.value)
        assert f"{d / a} (train)" in msg and f"{d / b} (train)" in msg, msg
        assert all(k in msg for k in kinds) and "same --tokenizer" in msg
    # The same tokenizer twice is a mixture.
    stream = D.open_stream(
        _data(mixture=f"{d / 'bytes'}=0.5,{d / 'bytes-copy'}=0.5"), shape, seed=0, vocab_size=2000
    )
    assert len(stream.corpora) == 2


def test_validation_path_reads_the_validation_split_and_refuses_the_training_data(token_dirs):
    from tierax.errors import TieraxError
    from tierax.train import data as D

    d = token_dirs
    shape = D.BatchShape(1, 2, 16)
    index = json.loads((d / "bytes" / "index.json").read_text())
    data = _data(path=str(d / "bytes-train-only"), validation_path=str(d / "bytes"),
                 validation_every=5, validation_batches=1)  # fmt: skip
    v = D.open_validation(data, 2, 16, vocab_size=300)
    assert v.corpus.name == f"{d / 'bytes'} (validation)"
    assert v.corpus.num_tokens == index["splits"]["validation"]["num_tokens"]
    # The training data itself (a copy of the directory: same tokens) as validation: refused.
    same = _data(path=str(d / "bytes-train-only"), validation_path=str(d / "bytes-train-only"),
                 validation_every=5, validation_batches=1)  # fmt: skip
    stream = D.open_stream(same, shape, seed=0, vocab_size=300)
    with pytest.raises(TieraxError, match="is the training data .* itself"):
        D.open_validation(same, 2, 16, vocab_size=300, training=stream.corpora)
    # Validation data of another tokenizer: refused too.
    other = _data(path=str(d / "bpe-a"), validation_path=str(d / "bytes"),
                  validation_every=5, validation_batches=1)  # fmt: skip
    stream = D.open_stream(other, shape, seed=0, vocab_size=2000)
    with pytest.raises(TieraxError, match="different tokenizers"):
        D.open_validation(other, 2, 16, vocab_size=2000, training=stream.corpora)


# -- 9: train's overrides may follow its flags --------------------------------------------------

DEMO = __import__("pathlib").Path(__file__).resolve().parents[1] / "configs" / "demo-train.yaml"


def test_train_overrides_after_flags_are_applied_in_order(monkeypatch, capsys):
    # The override after --resume reaches the config (steps=0 is refused there, by name, exit 2
    # before any work), not argparse's "unrecognized arguments".
    code, _, err = _main(monkeypatch, capsys, "train", str(DEMO), "steps=3", "--resume", "steps=0")
    assert code == 2 and "steps must be ≥ 1, got 0" in err, err
    from tierax.cli import _parse

    args = _parse(["train", str(DEMO), "steps=3", "--resume", "steps=25", "--json", "seed=1"])
    assert args.resume and args.json and args.overrides == ["steps=3", "steps=25", "seed=1"]
    # Anything else after the flags is still argparse's error.
    with pytest.raises(SystemExit) as e:
        _parse(["train", str(DEMO), "--resume", "--bogus"])
    assert e.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


# -- 13: data prepare --overwrite deletes only what tierax wrote --------------------------------


def test_prepare_overwrite_replaces_only_tierax_files(tmp_path):
    import tokenizer_files as TF

    text = tmp_path / "sample.txt"
    text.write_bytes(TF.SAMPLE.read_bytes()[:20_000])
    out = tmp_path / "d"
    r = _tierax("data", "prepare", str(text), "--out", str(out), "--shard-tokens", "4096")
    assert r.returncode == 0, r.stderr
    first = sorted(p.name for p in out.iterdir())
    assert first == ["index.json", "train-00000.bin", "train-00001.bin", "train-00002.bin",
                     "train-00003.bin", "train-00004.bin", "train-docs.bin"]  # fmt: skip
    (out / "README.md").write_text("the user's notes\n")
    (out / "mine").mkdir()
    (out / "mine" / "train-00009.bin").write_bytes(b"not tierax's")
    r = _tierax("data", "prepare", str(text), "--out", str(out), "--overwrite")
    assert r.returncode == 0, r.stderr
    # One shard now (the default shard size); the old five and their index are gone, the
    # user's file and directory stay untouched.
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "index.json", "mine", "train-00000.bin", "train-docs.bin"
    ]  # fmt: skip
    assert (out / "README.md").read_text() == "the user's notes\n"
    assert (out / "mine" / "train-00009.bin").read_bytes() == b"not tierax's"
    assert (out / "train-00000.bin").read_bytes() == text.read_bytes()  # byte-level tokens
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "sample.txt"]  # no temporaries


# -- 12: --eos none gets the same, true message with every tokenizer kind -----------------------


def test_eos_none_is_refused_for_what_it_is_with_every_tokenizer(tmp_path, monkeypatch, capsys):
    import tokenizer_files as TF

    from tierax.errors import TieraxError
    from tierax.train.data.tokenizer import load_tokenizer

    files = {
        "huggingface": TF.hf_bpe(tmp_path / "hf"),
        "sentencepiece": TF.sentencepiece_model(tmp_path / "sp"),
        "tiktoken": TF.tiktoken_file(tmp_path / "tt"),
    }
    for kind, f in files.items():
        assert load_tokenizer(str(f)).info.kind == kind  # each file loads without --eos
        with pytest.raises(TieraxError) as e:
            load_tokenizer(str(f), eos="none")
        assert str(e.value) == (
            "--eos none: every document needs an end-of-text token; name one with --eos TOKEN"
        ), kind
    out = tmp_path / "d"
    code, _, err = _main(
        monkeypatch, capsys, "data", "prepare", str(TF.SAMPLE), "--out", str(out),
        "--tokenizer", str(files["huggingface"]), "--eos", "none",
    )  # fmt: skip
    assert code == 2 and "--eos none: every document needs an end-of-text token" in err
    assert "names no end-of-text token" not in err and not out.exists()


# -- 11: an HF config's torch_dtype is modelled (the compute dtype), not listed as not modelled --


def test_hf_torch_dtype_sets_the_compute_dtype_and_is_not_called_unmodelled(tmp_path, capsys):
    from tierax.errors import TieraxError
    from tierax.interop.files import load_model_config

    fix = __import__("pathlib").Path(__file__).parent / "fixtures" / "hf"
    data = json.loads((fix / "Llama-3.1-405B.config.json").read_text())
    assert data["torch_dtype"] == "bfloat16"
    for dtype in ("float32", "bfloat16"):
        f = tmp_path / f"{dtype}.config.json"
        f.write_text(json.dumps({**data, "torch_dtype": dtype}))
        assert load_model_config(str(f)).dtype == dtype
        err = capsys.readouterr().err
        assert "not modelled" in err  # other keys (e.g. rope_scaling) still are, but not this one
        assert "torch_dtype" not in err.split("not modelled", 1)[1].splitlines()[0]
    f.write_text(json.dumps({**data, "torch_dtype": "int8"}))
    with pytest.raises(TieraxError, match="torch_dtype 'int8' is not a compute dtype"):
        load_model_config(str(f))


# -- 7: TPU capacities in one unit; "fits" names the limit it compares with -----------------------


def test_tpu_capacity_holds_xla_tpus_limit_and_fits_names_that_limit(monkeypatch, capsys):
    from tierax import hardware

    for key in ("v5e", "v5p", "v6e"):
        spec = hardware.get_target(key)
        # XLA:TPU cannot give one program more HBM than the chip has.
        assert spec.xla_hbm_limit_bytes <= spec.device_memory_bytes, key
        assert spec.device_memory_bytes % 2**30 == 0, key  # GiB, like every TPU figure here
    code, out, err = _main(
        monkeypatch, capsys, "plan", "--model", "tiny-llama", "--target", "v6e",
        "--microbatch", "2", "--seq", "64",
    )  # fmt: skip
    assert code == 0, err
    flat = " ".join(out.split())
    assert "fits (≤ XLA:TPU's HBM limit 31.2 GiB)" in flat, out
    assert "runtime reserve" not in flat and "of 32.0 GiB" in flat, out
    code, out, err = _main(
        monkeypatch, capsys, "plan", "--model", "tiny-llama", "--target", "h100",
        "--microbatch", "2", "--seq", "64",
    )  # fmt: skip
    assert code == 0 and "fits (≤ capacity − runtime reserve" in " ".join(out.split()), out


def test_sweep_png_and_bench_out_refuse_a_file_tierax_did_not_write(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "frontier.png"
    mine.write_bytes(b"\x89PNG\r\n\x1a\n the user's own picture")
    sweep = ["plan", "--model", "tiny-llama", "--microbatch", "2", "--seq", "32",
             "--sweep", "budget=1:2:1", "--out", str(mine)]  # fmt: skip
    code, _, err = _main(monkeypatch, capsys, *sweep)
    assert code == 2 and "is not a sweep plot tierax wrote" in err and "--force" in err, err
    assert mine.read_bytes().endswith(b"the user's own picture")
    assert not (tmp_path / "frontier.json").exists()
    assert _main(monkeypatch, capsys, *sweep, "--force")[0] == 0
    assert _main(monkeypatch, capsys, *sweep)[0] == 0  # now tierax's own plot: replaced
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}\n')
    code, _, err = _main(monkeypatch, capsys, "bench", "--model", "tiny-llama", "--out", str(notes))
    assert code == 2 and "is not a tierax.bench/1 record" in err and "--force" in err, err
    assert notes.read_text() == '{"mine": true}\n'


def test_every_highs_solve_goes_through_the_quiet_helper():
    """The fd-1 redirect guards only the calls made through it: no other module calls milp."""
    import pathlib

    src = pathlib.Path(__file__).resolve().parents[1] / "src" / "tierax"
    callers = sorted(
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if "milp" in p.read_text() and p.name != "quiet_milp.py"
    )
    assert callers == ["solving/planner.py"]
    text = (src / "solving" / "planner.py").read_text()
    assert "quiet_milp.milp(" in text and "import milp" not in text and ", milp" not in text
