"""bench/published_runs.py: every published run is listed (expressed, or with what is missing), and
a row's expression is the run's MaxText configuration."""

import importlib.util
import json
import pathlib
import re
import sys

import pytest
import yaml

from tierax import plan as P

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def _module():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("published_runs", BENCH / "published_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _config_plan(mod, spec: dict, hw: str, label: str):
    """The row's config and plan as its prediction gets them: the bench's run of it, through the
    library's one implementation (tierax.calibration.runs.config_and_plan)."""
    from tierax.calibration import runs

    return runs.config_and_plan(mod.to_run(spec, hw, 1, 1024, spec["remat"], label, None))


def test_every_run_and_pair_has_an_expression():
    mod = _module()
    data = yaml.safe_load(mod.DATA.read_text())
    holdout = yaml.safe_load(mod.HOLDOUT.read_text())
    assert {r["id"] for r in data["runs"] + holdout["runs"]} == set(mod.EXPRESS)
    assert {p["id"] for p in data["pairs"]} == set(mod.PAIRS)
    have = mod.available()
    assert set(have) >= {n for spec in mod.EXPRESS.values() for n in spec.get("needs", [])}


def test_a_custom_policy_row_becomes_the_plan_maxtext_ran():
    # G-2: q, k, v, out_proj and mlpwo kept; mlpwi_0/1 and the attention output recomputed; the
    # layer input kept (MaxText's default); every unnamed intermediate recomputed
    mod = _module()
    spec = mod.EXPRESS["G-2"]
    cfg, plan = _config_plan(mod, spec, "h100", "G-2")
    placed = P.resolve(plan, cfg)["decoder"]
    kept = {n for n, p in placed.items() if p is P.Placement.DEVICE}
    assert kept == {
        "decoder_layer_input",
        "query_proj",
        "key_proj",
        "value_proj",
        "out_proj",
        "mlpwo",
    }
    assert placed["mlpwi_0"] is P.Placement.REMAT and placed["attention_out"] is P.Placement.REMAT
    assert P.unnamed_placements(plan, cfg) == {"decoder": P.Placement.REMAT}
    assert cfg.attention == "cudnn" and cfg.dtype == "bfloat16" and cfg.param_dtype == "float32"


def test_holdout_rows_parse_and_each_is_expressed_or_says_what_it_needs():
    mod = _module()
    data = mod.load_data(mod.HOLDOUT)
    published = mod.load_data(mod.DATA)["runs"]
    have = mod.available()
    assert 4 <= len(data["runs"]) <= 8 and data["pairs"] == []
    # a holdout row is no row of the default file, nor the same model on the same hardware
    assert not {r["id"] for r in data["runs"]} & {r["id"] for r in published}
    pairs = {(r["model"], r["hw"]) for r in published}
    assert not {(r["model"], r["hw"]) for r in data["runs"]} & pairs
    expressed = []
    for run in data["runs"]:
        assert re.search(r"[\w-]+/[\w.-]+ \S+ ?.*@[0-9a-f]{40}", run["source"])  # repo path @commit
        missing = mod.row_missing(run, mod.EXPRESS[run["id"]], have)
        assert all(isinstance(m, str) and m for m in missing)
        if missing:
            continue
        spec = mod.EXPRESS[run["id"]]
        cfg, plan = _config_plan(mod, spec, run["hw"], run["id"])
        assert P.unnamed_placements(plan, cfg) == {"decoder": P.Placement.REMAT}
        expressed.append(run["id"])
    assert len(expressed) >= 4


def test_a_holdout_minimal_flash_row_keeps_every_matmul_output_and_the_context():
    # H-2 (MaxText minimal_flash): q, k, v, out_proj, mlpwi_0/1, mlpwo and the attention output
    # kept, the layer input kept, every unnamed intermediate recomputed
    mod = _module()
    spec = mod.EXPRESS["H-2"]
    cfg, plan = _config_plan(mod, spec, "h100", "H-2")
    placed = P.resolve(plan, cfg)["decoder"]
    assert set(placed) == {"decoder_layer_input", "attention_out", *mod.ALL_MATMULS_NAMES}
    assert all(p is P.Placement.DEVICE for p in placed.values())
    assert P.unnamed_placements(plan, cfg) == {"decoder": P.Placement.REMAT}
    # H-3: context and mlpwo offloaded, q/k/v/out_proj recomputed, vocabulary in 4 tiles
    spec = mod.EXPRESS["H-3"]
    cfg, plan = _config_plan(mod, spec, "v5p", "H-3")
    placed = P.resolve(plan, cfg)["decoder"]
    assert {n for n, p in placed.items() if p is P.Placement.OFFLOAD} == {"attention_out", "mlpwo"}
    assert placed["query_proj"] is P.Placement.REMAT and cfg.loss_tiles == 4


@pytest.mark.parametrize(
    "text, says",
    [
        (None, "is not a file"),
        ("runs: [a\n", "is not YAML"),
        ("pairs: []\n", "non-empty 'runs' list"),
        ("runs: []\n", "non-empty 'runs' list"),
        ("runs:\n  - {id: X, hw: h, devices: 8, model: m, source: s}\n", "lacks measured_step_s"),
        (
            "runs:\n  - {id: X, hw: h100, devices: 8, model: m, source: s, measured_step_s: 0}\n",
            "positive number",
        ),
        (
            "runs:\n  - {id: X, hw: h, devices: 8, model: m, source: s, measured_step_s: 1}\n"
            "  - {id: X, hw: h, devices: 8, model: m, source: s, measured_step_s: 2}\n",
            "appears twice",
        ),
    ],
)
def test_bad_data_file_is_refused_before_any_work(tmp_path, capsys, text, says):
    mod = _module()
    data = tmp_path / "runs.yaml"
    if text is not None:
        data.write_text(text)
    out = tmp_path / "record.json"
    with pytest.raises(SystemExit) as e:
        mod.main(["--data", str(data), "--out", str(out)])
    assert e.value.code == 2 and says in capsys.readouterr().err
    assert not out.exists()


def test_data_file_without_out_writes_its_own_record(tmp_path, monkeypatch):
    # one holdout row, run for real; the record is named after the data file, beside nothing else
    mod = _module()
    rows = [r for r in mod.load_data(mod.HOLDOUT)["runs"] if r["id"] in ("H-4", "H-6")]
    data = tmp_path / "mine.yaml"
    data.write_text(yaml.safe_dump({"runs": rows}))
    monkeypatch.setattr(mod._common, "RESULTS", tmp_path)
    assert mod.main(["--data", str(data)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json", "mine.yaml"]
    doc = json.loads((tmp_path / "mine.json").read_text())
    h4, h6 = doc["rows"]
    assert h4["expressible"] and h4["predicted_step_s"] > 0 and h4["measured_step_s"] == 6.32
    assert h4["ratio"] == h4["predicted_step_s"] / 6.32
    assert not h6["expressible"] and "precision" in h6["missing"][0]
    assert doc["summary"]["rows"] == 2 and doc["summary"]["expressible"] == 1


def test_docs_table_of_a_record_is_its_data_files_own(tmp_path, capsys, monkeypatch):
    """A holdout record writes the holdout table, never the published runs' one; a record of any
    other data file writes nothing (exit 2)."""
    mod = _module()
    written = []
    monkeypatch.setattr(
        mod._common, "write_docs_table", lambda marker, body: written.append(marker) or marker
    )
    record = tmp_path / "holdout_runs.json"
    doc = json.loads((ROOT / "bench/results/holdout_runs.json").read_text())
    record.write_text(json.dumps(doc))
    assert mod.main(["--docs", str(record)]) == 0 and written == ["holdout-runs"]
    record.write_text(json.dumps(doc | {"data": "bench/data/other.yaml"}))
    with pytest.raises(SystemExit) as e:
        mod.main(["--docs", str(record)])
    assert e.value.code == 2 and "nothing is written" in capsys.readouterr().err
    assert written == ["holdout-runs"]


def test_rows_predicts_only_those_and_never_replaces_the_whole_record(tmp_path, capsys):
    mod = _module()
    whole = BENCH / "results" / "published_runs.json"
    before = whole.read_bytes()
    # a partial run aimed at the whole record, or an unknown id: exit 2, nothing written
    assert mod.main(["--rows", "TR-10"]) == 2
    assert "--out" in capsys.readouterr().err
    out = tmp_path / "two.json"
    assert mod.main(["--rows", "TR-10,NOPE", "--out", str(out)]) == 2
    assert "NOPE" in capsys.readouterr().err and not out.exists()
    assert whole.read_bytes() == before
    assert mod.main(["--rows", "IW-8", "--out", str(out)]) == 0
    import json

    doc = json.loads(out.read_text())
    assert [r["id"] for r in doc["rows"]] == ["IW-8"] and doc["pairs"] == []
    # IW-8 (Llama 3.1 405B on 512 v7x devices) offloads decoder_layer_input and mlpwo; mlpwo is no
    # residual, so the host holds the carries alone: 126 layers × 3·8192·16384 bf16 per device.
    (row,) = doc["rows"]
    assert row["host_gib"] * 2**30 == 126 * 3 * 8192 * 16384 * 2
    assert row["fits"]


@pytest.mark.parametrize("record", ["published_runs.json", "holdout_runs.json"])
def test_the_records_were_made_with_the_current_default_rates(record):
    """A change to a target's default host link or HBM rate (a new chip measurement, a new source)
    leaves these records stale until the bench is rerun: every expressed row states the rates it
    was predicted with, and they are the cost model's defaults now (the v5e host link once changed
    without a rerun, and a pair's order moved unseen)."""
    from tierax import costmodel as cm

    doc = json.loads((ROOT / "bench" / "results" / record).read_text())
    rows = [(r["published"]["hw"], r) for r in doc["rows"] if r.get("expressible")]
    rows += [
        (pair["published"]["hw"], p)
        for pair in doc.get("pairs", [])
        for p in (pair.get("predictions") or {}).values()
    ]
    assert rows
    for hw, r in rows:
        now = cm.target_rates(hw, "bfloat16", calibration={}).sources
        for key in ("host_link", "hbm"):
            assert r["rates"][key] == now[key], (r.get("id"), hw, key)
