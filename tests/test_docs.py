"""The documentation can't rot: it builds strictly, and its examples marked runnable run.

* ``mkdocs build --strict`` (a broken link or anchor, a page missing from the nav, an unknown API
  reference, a failing generator in ``docs/hooks.py`` all fail it);
* every verb of the parser has a task guide whose built page lists every one of its options;
* the hand-written layer table of the organisation page names the layers ``tests/test_layering.py``
  states, in order;
* every fenced block titled ``runs on CPU`` is run (bash blocks with ``bash -euo pipefail``,
  Python blocks as a script) in a scratch directory where ``examples/``, ``configs/``, ``data/``
  and ``bench/`` of the repository are at hand; blocks titled ``runs on CPU (slow)`` run under
  ``-m slow``;
* README.md stays short, starts with the two set-up commands, its links into docs/ resolve, and its
  quickstart runs (`-m slow`).

Skipped, with the reason, only where mkdocs is not installed (``pip install -e '.[docs]'``; ``make``
installs the docs extra).
"""

from __future__ import annotations

import html
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

_missing = [
    m
    for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
    if importlib.util.find_spec(m.split(".")[0]) is None
]
pytestmark = pytest.mark.skipif(
    bool(_missing),
    reason=f"the docs extra is not installed ({', '.join(_missing)} missing): "
    "pip install -e '.[docs]' (make venv installs it)",
)

# A runnable example: a fenced block whose title says it runs on CPU (slow ones under -m slow).
FENCE = re.compile(
    r'^```(bash|python) title="runs on CPU( \(slow\))?"\n(.*?)^```\s*$', re.MULTILINE | re.DOTALL
)
SHARED = ("examples", "configs", "data", "bench")


def _hooks():
    spec = importlib.util.spec_from_file_location("tierax_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def examples(slow: bool) -> list:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        for i, m in enumerate(FENCE.finditer(page.read_text())):
            if bool(m.group(2)) == slow:
                uri = page.relative_to(DOCS).as_posix()
                found.append(pytest.param(m.group(1), m.group(3), id=f"{uri}#{i}"))
    return found


def _env() -> dict:
    env = dict(os.environ)
    bin_dir = str(pathlib.Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT / "examples"), env.get("PYTHONPATH", "")]
    )
    env["JAX_PLATFORMS"] = "cpu"
    env["NO_MKDOCS_2_WARNING"] = "1"
    return env


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    return out


def test_the_docs_build_strictly_with_every_generated_page(site):
    hooks = _hooks()
    for uri in hooks.GENERATED:
        assert (site / uri.removesuffix(".md") / "index.html").is_file(), uri
    api = (site / "reference" / "api" / "index.html").read_text()
    # to_policies is loaded lazily by tierax.plan (it needs JAX): documented where it is defined
    for name in ("tierax.api.inventory", "tierax.api.plan", "tierax.plan.policies.to_policies"):
        assert f'id="{name}"' in api, f"the API reference has no entry {name}"


def test_the_plans_page_lists_every_name_and_preset(site):
    from tierax.names import ALL_NAMES
    from tierax.plan import PRESETS

    built = html.unescape((site / "concepts" / "plans" / "index.html").read_text())
    assert "<!-- activation-names -->" not in built and "<!-- plan-presets -->" not in built
    for name in (*ALL_NAMES, *PRESETS):
        assert f"<code>{name}</code>" in built, f"concepts/plans: {name} missing"


def test_every_verb_has_a_guide_listing_every_option(site):
    hooks = _hooks()
    for verb, parser in hooks.verb_parsers().items():
        source = DOCS / "guide" / f"{verb}.md"
        assert source.is_file(), f"no task guide docs/guide/{verb}.md for `tierax {verb}`"
        assert f"<!-- cli-options: {verb} -->" in source.read_text(), f"{source} lists no options"
        built = html.unescape((site / "guide" / verb / "index.html").read_text())
        reference = html.unescape((site / "reference" / "cli" / "index.html").read_text())
        for action in parser._actions:
            for option in action.option_strings:
                if option in ("-h", "--help"):
                    continue
                assert f"<code>{option}</code>" in built, f"guide/{verb}: {option} missing"
                assert f"<code>{option}</code>" in reference, f"reference/cli: {option} missing"


def test_the_organisation_table_states_the_tested_layers():
    hooks = _hooks()
    text = (DOCS / "development" / "organisation.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    stated = [
        {m.strip("/") for m in re.findall(r"`([a-z_]+/?)`", row.split("|")[2])} for row in rows
    ]
    layers = hooks.stated_layers()
    # The table groups the foundations in one row; the other rows are the layers, in order.
    foundations = [set(layer) for layer in layers if set(layer) <= stated[0]]
    assert set().union(*foundations) == stated[0]
    assert [set(layer) for layer in layers[len(foundations) :]] == stated[1:]


@pytest.mark.parametrize(("lang", "code"), examples(slow=False))
def test_runnable_example(lang, code, tmp_path):
    r = _run(lang, code, tmp_path)
    assert r.returncode == 0, _failure(code, r)


@pytest.mark.slow
@pytest.mark.parametrize(("lang", "code"), examples(slow=True))
def test_slow_runnable_example(lang, code, tmp_path):
    r = _run(lang, code, tmp_path)
    assert r.returncode == 0, _failure(code, r)


def _failure(code: str, r: subprocess.CompletedProcess) -> str:
    return f"example failed (exit {r.returncode}):\n{code}\n{r.stdout}\n{r.stderr}"


def _run(lang: str, code: str, workdir: pathlib.Path) -> subprocess.CompletedProcess:
    """The example run in ``workdir`` (the repository's shared files linked in)."""
    for name in SHARED:
        (workdir / name).symlink_to(ROOT / name)
    if lang == "bash":
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    else:
        (workdir / "example.py").write_text(code)
        cmd = [sys.executable, "example.py"]
    return subprocess.run(cmd, cwd=workdir, env=_env(), capture_output=True, text=True, timeout=600)


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines"
    assert "make demo" in lines[3] and "make test" in lines[4], "README must open with the set-up"
    for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_the_demo_result_page_has_the_readmes_generated_table():
    from tierax.report import report as R

    def section(text: str) -> str:
        return text[text.index(R.README_START) : text.index(R.README_END)]

    page = (DOCS / "results" / "index.md").read_text()
    assert section(page) == section((ROOT / "README.md").read_text())


def test_the_verb_summary_names_only_options_the_parser_has():
    hooks = _hooks()
    parsers = hooks.verb_parsers()
    rows = [
        line
        for line in (DOCS / "guide" / "index.md").read_text().splitlines()
        if line.startswith("| `tierax ")
    ]
    assert {row.split()[2].strip("`") for row in rows} == set(parsers), "a verb has no summary row"
    for row in rows:
        verb = row.split()[2].strip("`")
        known = {s for a in parsers[verb]._actions for s in a.option_strings}
        usage = re.split(r"(?<!\\)\|", row)[1]
        for option in re.findall(r"(?<![\w-])--[a-z][a-z-]*", usage):
            assert option in known, f"guide/index.md: `tierax {verb}` has no option {option}"


@pytest.mark.slow
def test_the_readme_quickstart_runs(tmp_path):
    """README.md's one bash block (plan Llama 3 8B for 8 H200s, show it, compile it deviceless)."""
    blocks = re.findall(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    assert len(blocks) == 1, "README.md should have one bash block, the quickstart"
    code = blocks[0].replace(".venv/bin/tierax", "tierax")
    r = _run("bash", code, tmp_path)
    assert r.returncode == 0, _failure(code, r)
