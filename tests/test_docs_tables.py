"""The measured tables on the docs pages are what their bench scripts generate from the records.

Each table stands between ``<!-- MARKER:start -->`` and ``<!-- MARKER:end -->`` on one page under
docs/, and the script's ``--docs`` option rewrites it there from its record (no compiles); here the
committed text must equal the script's function applied to the committed record, so a record
rerun without ``--docs`` (or a hand edit of a table) fails.  Needs neither JAX nor mkdocs.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"

# (bench script under bench/, the function that renders the table, the record, the marker)
DOCS_TABLES = [
    ("estimator_peer", "markdown", "estimator_peer.json", "estimator-peer"),
    ("estimator_maxtext", "render", "estimator_maxtext.json", "estimator-maxtext"),
    ("tpu_compile", "markdown", "tpu_compile.json", "tpu-compile"),
    ("tpu_compile", "default_env_markdown", "tpu_default_env.json", "tpu-default-env"),
    ("tpu_compile", "v6e_env_markdown", "tpu_default_env_v6e.json", "tpu-default-env-v6e"),
    ("hide_grid", "table", "hide_grid.json", "hide-grid"),
    ("investigations/row_stride", "markdown", "row_stride.json", "row-stride"),
    ("time_fidelity", "markdown", "time_fidelity.json", "time-fidelity"),
    ("time_fidelity", "markdown", "time_fidelity_deepseek.json", "time-fidelity-deepseek"),
    ("gemm_shapes", "markdown", "gemm_shapes.json", "gemm-shapes"),
    ("investigations/gemm_size_ab", "markdown", "gemm_size_ab.json", "gemm-size-ab"),
    ("mesh_search", "readme", "mesh_search.json", "mesh-search"),
    ("published_runs", "markdown", "published_runs.json", "published-runs"),
    ("published_runs", "markdown", "holdout_runs.json", "holdout-runs"),
    ("compile_grid", "markdown", "compile_grid.json", "compile-grid"),
    ("compile_grid", "markdown", "compile_cudnn.json", "compile-cudnn"),
    ("compile_grid", "markdown", "compile_scale.json", "compile-scale"),
    ("compile_grid", "markdown", "compile_scale_dense.json", "compile-scale-dense"),
    ("peer_maxtext", "markdown", "peer_maxtext.json", "peer-maxtext"),
    ("data_prepare", "markdown", "data_prepare.json", "data-prepare"),
    ("seed_case", "markdown", "seed_case.json", "seed-case"),
    ("investigations/prefetch_overlap", "markdown", "prefetch_overlap.json", "prefetch-overlap"),
    ("fp8_compile", "markdown", "fp8_compile.json", "fp8-compile"),
    ("ragged_ep_compile", "markdown", "ragged_ep_compile.json", "ragged-ep-compile"),
    ("investigations/tpu_tiled_loss", "markdown", "tpu_tiled_loss.json", "tpu-tiled-loss"),
    ("state_offload", "markdown", "state_offload.json", "state-offload"),
    ("network_axes", "markdown", "network_axes.json", "network-axes"),
    ("whatif", "markdown", "whatif-deepseek-v3.json", "whatif-deepseek-v3"),
    ("tpu_compile", "splash_markdown", "tpu_splash.json", "tpu-splash"),
    ("tpu_kernel_rates", "markdown", "tpu_kernel_rates.json", "tpu-kernel-rates"),
    ("maxtext_compile", "render", "maxtext_compile.json", "maxtext-compile"),
    ("maxtext_fidelity", "render", "maxtext_fidelity.json", "maxtext-fidelity"),
    ("maxtext_plan_check", "render", "maxtext_plan_check.json", "maxtext-plan-check"),
    (
        "tpu_compile",
        "splash_markdown",
        "tpu_splash_libtpu_0.0.42.1.json",
        "tpu-splash-libtpu-0.0.42",
    ),
]


def _bench(name: str):
    """The script ``bench/NAME.py`` (NAME may be ``investigations/SCRIPT``) as a module."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the scripts import _common as a sibling
    module_name = "docs_table_" + name.replace("/", "_")
    spec = importlib.util.spec_from_file_location(module_name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _section(text: str, marker: str) -> str:
    start, end = f"<!-- {marker}:start -->\n", f"<!-- {marker}:end -->"
    return text[text.index(start) + len(start) : text.index(end)]


@pytest.mark.parametrize(("script", "function", "record", "marker"), DOCS_TABLES)
def test_a_docs_table_is_its_record_rendered(script, function, record, marker):
    common = _bench("_common")
    page = common.docs_page(marker)
    body = getattr(_bench(script), function)(
        json.loads((ROOT / "bench/results" / record).read_text())
    )
    body = body if body.endswith("\n") else body + "\n"
    assert _section(page.read_text(), marker) == body, (
        f"{page.relative_to(ROOT)}'s {marker} table is not bench/results/{record} rendered: "
        f"run python bench/{script}.py --docs"
    )


def test_write_docs_table_splices_the_one_page_and_refuses_ambiguity(tmp_path, monkeypatch):
    common = _bench("_common")
    monkeypatch.setattr(common, "DOCS", tmp_path)
    page = tmp_path / "a" / "page.md"
    page.parent.mkdir()
    page.write_text("# t\n\nbefore\n<!-- x:start -->\nold\n<!-- x:end -->\nafter\n")
    (tmp_path / "other.md").write_text("no marker here\n")
    assert common.write_docs_table("x", "| new |") == page
    assert page.read_text() == "# t\n\nbefore\n<!-- x:start -->\n| new |\n<!-- x:end -->\nafter\n"
    (tmp_path / "other.md").write_text("<!-- x:start -->\n<!-- x:end -->\n")
    with pytest.raises(SystemExit, match="one page under docs/ must hold"):
        common.write_docs_table("x", "| newer |")
    assert "| new |" in page.read_text()  # refused before anything was written
    with pytest.raises(SystemExit, match="found: none"):
        common.docs_page("y")


def test_docs_record_refuses_a_missing_file_bad_json_and_another_schema(tmp_path):
    import argparse

    read = _bench("_common").docs_record("tierax.good/1")
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        read(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(argparse.ArgumentTypeError, match="is not a JSON record"):
        read(str(tmp_path / "bad.json"))
    (tmp_path / "other.json").write_text('{"schema": "tierax.other/1"}')
    with pytest.raises(argparse.ArgumentTypeError, match="renders tierax.good/1"):
        read(str(tmp_path / "other.json"))
    (tmp_path / "good.json").write_text('{"schema": "tierax.good/1", "x": 1}')
    assert read(str(tmp_path / "good.json")) == {"schema": "tierax.good/1", "x": 1}


def test_every_marked_table_on_the_docs_pages_has_a_generator():
    """A ``<!-- NAME:start -->`` table on a docs page is one DOCS_TABLES renders (or the demo
    table `tierax report --readme` writes, checked in tests/test_docs.py)."""
    import re

    found = {
        m
        for page in (ROOT / "docs").rglob("*.md")
        for m in re.findall(r"^<!-- ([a-z0-9.-]+):start -->$", page.read_text(), re.M)
    }
    assert found - {marker for *_, marker in DOCS_TABLES} == {"perf-table"}
