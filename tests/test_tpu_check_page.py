"""The chip check's docs page is what its records render to: the page names the command that wrote
it (``bench/tpu_check.py --render RECORDS``), and rendering those records again gives the page."""

import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results" / "tpu-check.md"


def _records() -> list[pathlib.Path]:
    m = re.search(r"`python bench/tpu_check\.py --render ([^`]+)`", PAGE.read_text())
    assert m, "the page does not name the command that wrote it"
    return [ROOT / r for r in m.group(1).split()]


def test_the_page_is_its_records_rendered_again(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    import _tpu_check_report as report

    page, _ = report.render(_records(), tmp_path / "page.md", tmp_path / "page.png")
    assert page.read_text() == PAGE.read_text()


def test_every_record_on_the_page_was_made_on_the_chip():
    for r in _records():
        d = json.loads(r.read_text())
        assert d["machine"]["platform"] == "tpu", r
        assert d["machine"]["device_kind"] == "TPU v5 lite", r
        assert not d["tiny"], r


def test_planned_from_takes_case_plan_pairs_and_refuses_what_it_cannot_read(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    import tpu_check

    plan = tmp_path / "p.yaml"
    plan.write_text("plan: p\ngroups: {}\n")
    assert tpu_check.planned_from(f"dense:8={plan}, dense-hd64:4={plan}") == {
        ("dense", 8): plan,
        ("dense-hd64", 4): plan,
    }
    assert tpu_check.planned_from("") == {}
    for bad, why in (
        (f"dense={plan}", "is not MODEL:MICROBATCH=PLAN.yaml"),
        ("dense:8", "is not MODEL:MICROBATCH=PLAN.yaml"),
        (f"dense:8={tmp_path / 'missing.yaml'}", "no plan file"),
    ):
        with pytest.raises(ValueError, match=why):
            tpu_check.planned_from(bad)
