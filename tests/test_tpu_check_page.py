"""The chip check's docs page is what its records render to: the page names the command that wrote
it (``bench/tpu_check.py --render RECORDS``), and rendering those records again gives the page."""

import json
import pathlib
import re
import sys

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
