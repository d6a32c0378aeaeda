"""Faults a new user hit on the command line (issue 40's medium and low items): each refused with
the cause and the fix, or shown as what it is."""

import json
import re

import pytest


def test_mesh_auto_blames_divisibility_not_the_budget(cli):
    # tiny-llama on 8 devices: tensor=8 and tensor=4 are refused by its heads (4 query, 2 key/value
    # heads), so every mesh splits the batch 4 or 8 ways; 7 sequences divide neither.
    r = cli("plan", "--model", "tiny-llama", "--mesh", "auto", "--devices", "8",
            "--global-batch", "7")  # fmt: skip
    assert r.returncode == 2
    assert "global batch 7 is not divisible" in r.stderr and "4, 8 ways" in r.stderr
    assert "multiple of 4" in r.stderr
    assert "the closest:" not in r.stderr and "within the device budget" not in r.stderr


def _json(r):
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("vocab, phase", [(256, "layer backward"), (32000, "loss")])
def test_memory_breakdown_rows_add_up_to_the_peak_of_its_phase(cli, vocab, phase):
    from tierax.costmodel import Breakdown, peak_rows

    args = ["simulate", "--plan", "remat-full", "--set", f"vocab_size={vocab}"]
    d = _json(cli(*args, "--json"))
    b, peak = d["breakdown"], d["peak_device_bytes"]
    common = b["state_bytes"] + b["activation_bytes"] + b["staging_bytes"]
    common += b["stack_copy_bytes"] + b["fixed_device_bytes"]
    layer = common + b["workspace_bytes"]
    loss = common - b["embed_grad_bytes"] + b["logits_bytes"]
    assert peak == max(layer, loss) and b["peak_phase"] == phase
    assert (loss > layer) == (phase == "loss")
    rows = peak_rows(Breakdown.from_json(b))
    assert sum(n for _, n in rows) == peak
    labels = " ".join(label for label, _ in rows)
    assert ("workspace" in labels) == (phase != "loss") and ("logits" in labels) == (
        phase == "loss"
    )
    table = cli(*args).stdout
    assert ("at the loss" if phase == "loss" else "in a layer backward") in table
    assert "not in the peak" in table


def _mib(text: str) -> float:
    n, unit = text.split()
    return float(n) * {"B": 2**-20, "KiB": 2**-10, "MiB": 1, "GiB": 2**10}[unit]


@pytest.mark.parametrize("vocab", [256, 32000])
def test_no_plan_fits_terms_sum_to_its_total(cli, vocab):
    r = cli("plan", "--set", f"vocab_size={vocab}", "--budget-gib", "0.001")
    assert r.returncode == 2
    m = re.search(r"still needs ([\d.]+ \w+) (?:at the loss|in a layer backward) \((.*?)\)\. ",
                  r.stderr)  # fmt: skip
    assert m, r.stderr
    terms = re.findall(r"([\d.]+ (?:B|KiB|MiB|GiB))", m.group(2))
    assert len(terms) >= 3
    assert sum(map(_mib, terms)) == pytest.approx(_mib(m.group(1)), abs=0.02)


def test_no_plan_fits_does_not_suggest_the_max_microbatch_it_ran(cli):
    r = cli("plan", "--budget-gib", "0.001", "--max-microbatch")
    assert r.returncode == 2 and "no plan fits" in r.stderr
    assert "--max-microbatch" not in r.stderr and "Even microbatch 1 does not fit" in r.stderr
    r = cli("plan", "--budget-gib", "0.001")
    assert r.returncode == 2 and "--max-microbatch" in r.stderr


@pytest.mark.parametrize("extra", [[], ["--mesh", "auto", "--devices", "8"]])
def test_budget_above_the_devices_capacity_is_refused(cli, monkeypatch, extra):
    from tierax import launch

    monkeypatch.setattr(launch, "start", lambda **k: pytest.fail("started JAX before refusing"))
    r = cli("plan", "--target", "h200", "--budget-gib", "200", *extra)
    assert r.returncode == 2
    # H200: 141 GB datasheet capacity is 141 GiB in tierax's table; a step may use less
    assert "--budget-gib 200 is more than h200's device offers: capacity 141.00 GiB" in r.stderr


def test_a_misspelled_command_line_override_is_named_as_one(tmp_path):
    from tierax.errors import TieraxError
    from tierax.train.config import load_train_config

    f = tmp_path / "run.yaml"
    f.write_text("model: tiny-llama\nsteps: 2\n")
    for override, hint in (("stepz=3", "'steps'"), ("mesh.fsdpp=2", "'mesh.fsdp'")):
        with pytest.raises(TieraxError) as e:
            load_train_config(f, [override])
        msg = str(e.value)
        assert msg.startswith(f"command-line override {override!r}: unknown key"), msg
        assert f"did you mean {hint}" in msg and str(f) not in msg
    # a typo in the file itself is still the file's
    f.write_text("model: tiny-llama\nstepz: 2\n")
    with pytest.raises(TieraxError, match=f"^{f}: unknown key 'stepz'"):
        load_train_config(f)


def _help(cli, *verb):
    r = cli(*verb, "--help")
    assert r.returncode == 0
    return " ".join(r.stdout.split())


@pytest.mark.parametrize("verb", ["plan", "simulate", "inventory"])
def test_target_help_lists_every_target(cli, verb):
    from tierax import hardware

    text = _help(cli, verb)
    for key in [*hardware.TARGETS, *hardware.TPU_TARGETS, "cpu"]:
        assert re.search(rf"\b{key}\b", text), (verb, key)
    assert "--devices N without --mesh means fsdp=N" in text


@pytest.mark.parametrize("verb", ["plan", "simulate", "compile"])
def test_target_help_says_what_devices_counts_per_tpu(cli, verb):
    """--devices counts JAX devices: a chip where a chip shows one (v5p's two TensorCores are one
    megacore device), a TensorCore where it shows two (v7x) — as the hardware table has it."""
    from tierax import hardware

    text = _help(cli, verb)
    chip = re.search(r"a chip on ([\w, ]+?);", text)
    core = re.search(r"a TensorCore on ([\w, ]+?), 2 a chip", text)
    assert chip and core, text
    for key, spec in hardware.TPU_TARGETS.items():
        listed = chip.group(1) if spec.devices_per_chip == 1 else core.group(1)
        assert key in listed.split(", "), (key, spec.devices_per_chip)
    assert "devices = TensorCores" not in text


def test_compile_help_names_tpu_targets_too(cli):
    text = _help(cli, "compile")
    assert "GPU or TPU target" in text and "XLA:TPU" in text


@pytest.mark.parametrize("verb", ["plan", "simulate"])
def test_rate_help_lists_every_rate_key(cli, verb):
    from tierax.costmodel.rates import RATE_KEYS

    text = _help(cli, verb)
    for key in RATE_KEYS:
        assert re.search(rf"\b{key}\b", text), (verb, key)


def test_calibrate_help_names_everything_it_measures(cli):
    text = _help(cli, "calibrate")
    for what in ("matmul", "first-touch", "transposing fusions", "host→device", "device→host"):
        assert what in text, what


def test_rate_override_replaces_the_source_it_overrides(cli):
    d = _json(cli("simulate", "--rate", "host_link=7", "--rate", "matmul=100", "--json"))
    src = d["breakdown"]["rates"]
    assert src["host_link"] == "--rate host_link=7 (GB/s per direction, both ways)"
    assert src["matmul"].startswith("--rate matmul=100") and "PCIe" not in src["host_link"]
    one_way = _json(cli("simulate", "--rate", "d2h=7", "--json"))["breakdown"]["rates"]
    assert one_way["host_link"].startswith("--rate d2h=7") and "otherwise" in one_way["host_link"]


def test_host_budget_zero_means_no_offload(cli):
    from gpu_budget import fixed_bytes

    # a budget that makes the plan offload: 11.36 MiB for the model's own buffers beside XLA:GPU's
    # fixed bytes (by jaxlib release; 0.015 GiB in all when those were 4 MiB); offloads hide
    gib = f"{(fixed_bytes('h200') + 11.36 * 2**20) / 2**30:.6f}"
    fast = ["--budget-gib", gib, "--rate", "host_link=100000", "--json"]
    r = cli("plan", "--host-budget-gib", "0", *fast)
    d = _json(r)
    assert d["host_budget_bytes"] == 0 and d["predicted"]["host_bytes"] == 0
    # with host memory, the same budget offloads: the zero changed the plan
    free = _json(cli("plan", *fast))
    assert free["predicted"]["host_bytes"] > 0
    r = cli("plan", "--host-budget-gib", "-1")
    assert r.returncode == 2 and "≥ 0" in r.stderr


def test_plans_lists_and_shows_without_importing_jax(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; from tierax.cli import main; "
        "main(['plans']); main(['plans', '--model', 'tiny-deepseek', '--show', "
        "'deepseek-offload', '--yaml']); main(['plans', '--show', 'save-all']); "
        "print('JAX' if 'jax' in sys.modules else 'NOJAX', file=sys.stderr)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr.strip().endswith("NOJAX"), r.stderr


def test_plan_yaml_keeps_non_ascii_readable(cli, tmp_path):
    out = tmp_path / "p.yaml"
    r = cli("plan", "--mesh", "auto", "--devices", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text(encoding="utf-8")
    assert "×" in text and "\\x" not in text and "\\u" not in text


def test_plan_for_the_cpu_prints_no_transfer_times(cli, monkeypatch, tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"cpu": {"created": "hand", "matmul_flops_per_s": 1e11,
                                       "matmul_flops_per_s_float32": 1e11,
                                       "memory_bytes_per_s": 1e10}}))  # fmt: skip
    monkeypatch.setenv("TIERAX_CALIBRATION", str(cal))
    d = _json(cli("plan", "--target", "cpu", "--json"))
    assert d["explain"] and all(
        e["transfer_s"] is None and e["hidden_fraction"] is None for e in d["explain"]
    )
    r = cli("plan", "--target", "cpu")
    assert r.returncode == 0, r.stderr
    assert not re.search(r"\de\+0[5-9]", r.stdout), r.stdout  # the link's 1 B/s placeholder
    assert "offloading is a no-op on this backend" in " ".join(r.stdout.split())


def test_mesh_search_table_keeps_mesh_names_whole(tmp_path):
    from rich.console import Console

    from tierax.report.tables import mesh_search_table

    def cand(mesh):
        return {
            "mesh": mesh, "microbatch": 1, "grad_accum": 1, "tokens_per_s": 1e6,
            "step_time_s": 1.0, "collective_s": {"fsdp": 0.1}, "links": {},
            "exposed_collective_s": 0.0, "peak_device_bytes": 2**30, "host_bytes": 0,
        }  # fmt: skip

    meshes = [{"data": 16, "fsdp": 64, "tensor": 8, "expert": 32}, {"fsdp": 8}]
    doc = {"candidates": [cand(m) for m in meshes], "top": 2}
    console = Console(width=90, record=True, file=open(tmp_path / "out.txt", "w"))  # noqa: SIM115
    console.print(mesh_search_table(doc, "t"))
    text = console.export_text()
    assert "data=16,fsdp=64,tensor=8,expert=32" in text and "fsdp=8" in text, text


def test_models_shows_tiny_parameter_counts_readably(cli):
    # tiny-llama by hand: embedding and head 256 × 64 each; per layer q, o 64 × 64, k, v 64 × 32,
    # gate, up, down 3 × 64 × 128, two norms 64; 4 layers; the final norm 64.
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
    assert 2 * 256 * 64 + 4 * per_layer + 64 == 180_800
    row = next(line for line in cli("models").stdout.splitlines() if "tiny-llama" in line)
    assert "180.8 K" in row and "0.000 B" not in row


def test_inventory_title_shows_the_mesh_as_axes(cli):
    r = cli("inventory", "--mesh", "fsdp=2")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "mesh data=1,fsdp=2,tensor=1,expert=1" in text and "{'data'" not in text


def test_debug_keeps_the_bad_input_exit_code(cli):
    r = cli("--debug", "plan", "--budget-gib", "500")
    assert r.returncode == 2
    assert "Traceback" in r.stderr and "tierax plan: error: --budget-gib 500" in r.stderr


def test_maxtext_model_file_typo_gets_did_you_mean(cli, tmp_path):
    f = tmp_path / "model.yml"
    f.write_text(
        "decoder_block: llama2\nbase_emb_dm: 64\nbase_num_query_heads: 4\n"
        "base_num_decoder_layers: 2\nvocab_size: 256\nbase_mlp_dim: 128\n"
        "base_num_kv_heads: 2\nhead_dim: 16\n"
    )
    r = cli("simulate", "--model-config", str(f))
    assert r.returncode == 2 and "did you mean 'base_emb_dim' for 'base_emb_dm'" in r.stderr


@pytest.mark.parametrize("gz", [False, True])
def test_oversize_document_error_reports_its_real_size(tmp_path, gz):
    import gzip

    from tierax.errors import TieraxError
    from tierax.train.data import documents

    size = 3 * 2**20 + 12_345  # bytes, over a 1 MiB limit
    f = tmp_path / ("doc.txt.gz" if gz else "doc.txt")
    data = b"a" * size
    f.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(TieraxError) as e:
        list(documents._text_document(f, gz, 2**20, False))
    assert f"a document of {size:,} bytes" in str(e.value), str(e.value)


def test_plot_metrics_writes_png_and_refuses_another_suffix(cli, tmp_path):
    """The plot is PNG (the one format tierax can recognise as its own when asked to replace a
    file); another suffix is refused with exit 2, nothing written — never PNG bytes under a .jpg."""
    run = tmp_path / "run"
    run.mkdir()
    rec = {"loss": 2.0, "grad_norm": 1.0, "lr": 1e-3, "step_time_s": 0.1, "tokens_per_s": 10.0,
           "tflops_per_device": 0.1, "time": 0.0}  # fmt: skip
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": k, **rec}) + "\n" for k in (1, 2))
    )
    r = cli("plot-metrics", str(run), "--out", str(tmp_path / "x.png"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "x.png").read_bytes().startswith(b"\x89PNG")
    for bad in ("x.jpg", "x.txt", "x"):
        r = cli("plot-metrics", str(run), "--out", str(tmp_path / bad))
        assert r.returncode == 2 and ".png" in r.stderr, r.stderr
        assert not (tmp_path / bad).exists()


@pytest.mark.slow  # a benchmark run
def test_bench_json_is_a_record_report_reads(cli, tmp_path):
    r = cli("bench", "--model", "tiny-llama", "--plans", "save-all", "--steps", "2",
            "--microbatch", "2", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "tierax.bench/1" and doc["records"][0]["plan"] == "save-all"
    f = tmp_path / "bench.json"
    f.write_text(r.stdout)
    rep = cli("report", str(f), "--out", str(tmp_path / "rep"))
    assert rep.returncode == 0, rep.stderr


@pytest.mark.parametrize("segments", [False, True])
def test_sweep_title_names_what_is_swept_and_whether_segments_were_considered(cli, segments):
    extra = ["--segments"] if segments else []
    d = _json(cli("plan", "--sweep", "microbatch=2:4:2", *extra, "--json"))
    assert "microbatch 8/device" not in d["title"] and "microbatch swept" in d["title"]
    assert d["segments"] is segments
    assert ("layer segments considered" in d["title"]) is segments
    assert ("no --segments" in d["title"]) is not segments


def test_an_input_given_twice_is_refused_before_anything_is_written(cli, tmp_path):
    doc = tmp_path / "a.txt"
    doc.write_text("one document\n")
    out = tmp_path / "tok"
    for twice in ([doc, doc], [doc, tmp_path / "." / "a.txt"]):
        r = cli("data", "prepare", *map(str, twice), "--out", str(out))
        assert r.returncode == 2 and "counted twice" in r.stderr and "give each input once" in (
            r.stderr
        )
        assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert cli("data", "prepare", str(doc), "--out", str(out)).returncode == 0


def test_a_mixture_naming_one_dataset_twice_is_refused():
    from tierax.errors import TieraxError
    from tierax.train.config import config_from_mapping

    data = {"source": "tokens", "mixture": "runs/web=0.5,runs/books=0.2,./runs/web=0.3"}
    with pytest.raises(TieraxError, match="names one dataset twice .*'runs/web' and './runs/web'"):
        config_from_mapping({"model": "tiny-llama", "data": data}, source="c")


def test_the_step_tables_host_transfers_do_not_read_as_exposed_time(cli):
    """An offload plan's copies take time at the link, most of it hidden: the row gives that time,
    then the exposed part, each named, so the first figure does not read as time the step loses."""
    r = cli("simulate", "--model", "tiny-llama", "--plan", "qkv-offload", "--target", "h200")
    assert r.returncode == 0, r.stderr
    row = re.search(
        r"host transfers at the link \(of which exposed: d2h / h2d\)\s*│\s*([\d.]+) ms "
        r"\(exposed ([\d.]+) ms / ([\d.]+) ms\)",
        r.stdout,
    )
    assert row, r.stdout
    link, d2h, h2d = map(float, row.groups())
    assert link > d2h + h2d  # some of it hidden: the two figures differ
    assert re.search(r"collectives \(of which exposed\)\s*│\s*[\d.]+ ms \(exposed [\d.]+ ms\)",
                     r.stdout)  # fmt: skip


MAX_MB = ["plan", "--model", "tiny-llama", "--set", "vocab_size=32000", "--seq", "128",
          "--max-microbatch", "--target", "h200", "--budget-gib", "0.2", "--json"]  # fmt: skip


def _largest_line(doc: dict) -> tuple[int, int, int]:
    line = " ".join(doc["notes"])
    found = re.search(
        r"largest microbatch that fits: (\d+) per device \((\d+) does not\); with the loss in 2 "
        r"tiles \(--set loss_tiles=2\) (\d+) fits",  # (below 1,000: no thousands separator)
        line,
    )
    assert found, line
    return tuple(map(int, found.groups()))


def test_max_microbatch_says_what_it_found_and_what_loss_tiles_would_allow(cli):
    """plan --max-microbatch names the microbatch it found; where the logits make the next one's
    peak, the loss in 2 tiles lets a larger one fit, and the line gives that microbatch."""
    doc = _json(cli(*MAX_MB))
    mb, above, tiled = _largest_line(doc)
    assert mb == doc["microbatch"] and above == mb + 1 and tiled > mb


@pytest.mark.slow  # two microbatch searches, each with its tiling's search
def test_the_loss_tiles_hint_is_what_max_microbatch_finds_with_that_option(cli):
    _, _, tiled = _largest_line(_json(cli(*MAX_MB)))
    assert _json(cli(*MAX_MB, "--set", "loss_tiles=2"))["microbatch"] == tiled
