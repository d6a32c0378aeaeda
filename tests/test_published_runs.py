"""bench/published_runs.py: every published run is listed (expressed, or with what is missing), and
a row's expression is the run's MaxText configuration."""

import importlib.util
import pathlib
import sys

import yaml

from tierax import plan as P

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"


def _module():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("published_runs", BENCH / "published_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_run_and_pair_has_an_expression():
    mod = _module()
    data = yaml.safe_load(mod.DATA.read_text())
    assert {r["id"] for r in data["runs"]} == set(mod.EXPRESS)
    assert {p["id"] for p in data["pairs"]} == set(mod.PAIRS)
    have = mod.available()
    assert set(have) >= {n for spec in mod.EXPRESS.values() for n in spec.get("needs", [])}


def test_a_custom_policy_row_becomes_the_plan_maxtext_ran():
    # G-2: q, k, v, out_proj and mlpwo kept; mlpwi_0/1 and the attention output recomputed; the
    # layer input kept (MaxText's default); every unnamed intermediate recomputed
    mod = _module()
    spec = mod.EXPRESS["G-2"]
    cfg = mod._config(spec, spec["attention"])
    plan = mod._plan(spec["remat"], cfg, "gpu", "G-2")
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
