"""bench/README.md is the index of bench/: every script has an entry, every entry names a script,
the file is what ``python bench/_index.py`` writes from the docstrings now, and every finished
investigation under bench/investigations/ states its question, its records and the docs pages that
quote them (and those pages name it).  Files are read, nothing is run or imported but the
generator."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import re
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
README = BENCH / "README.md"
# Where a moved script's old path would linger: the docs, the tests, the bench scripts and the
# top-level files that name commands.
SCOPE = ("src", "docs", "tests", "bench", "README.md", "Makefile", "mkdocs.yml")


def _index():
    spec = importlib.util.spec_from_file_location("bench_index", BENCH / "_index.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks the module up there
    spec.loader.exec_module(module)
    return module


def _scripts() -> set[str]:
    return {
        p.relative_to(BENCH).as_posix()
        for p in [*BENCH.glob("*.py"), *(BENCH / "investigations").glob("*.py")]
    }


def _linked() -> list[str]:
    """The scripts the index links to: ``[`NAME.py`](NAME.py)``, relative to bench/."""
    return re.findall(r"\[`([\w/]+\.py)`\]\(\1\)", README.read_text(encoding="utf-8"))


def test_every_script_has_one_entry_and_every_entry_names_a_script():
    linked = _linked()
    assert len(linked) == len(set(linked)), "a script is listed twice"
    assert not _scripts() - set(linked), "scripts without an entry: run python bench/_index.py"
    assert not set(linked) - _scripts(), "entries naming no script: run python bench/_index.py"


def test_the_index_is_what_the_generator_writes_from_the_docstrings_now():
    assert README.read_text(encoding="utf-8") == _index().render(), (
        "bench/README.md is stale: run python bench/_index.py"
    )


def test_each_benchmark_entry_is_its_docstrings_first_paragraph():
    text = README.read_text(encoding="utf-8")
    for path in sorted(BENCH.glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        first = " ".join(doc.split("\n\n")[0].split()).replace("``", "`").replace("|", "\\|")
        assert f"| [`{path.name}`]({path.name}) | {first} |" in text, path.name


@pytest.mark.parametrize(
    "path", sorted((BENCH / "investigations").glob("*.py")), ids=lambda p: p.name
)
def test_an_investigation_states_its_question_records_and_the_docs_that_quote_it(path):
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    lines = doc.splitlines()
    question = [ln for ln in lines if re.match(r"Question( \([^)]*\))?: \S", ln)]
    records = [ln for ln in lines if ln.startswith("Records: bench/results/")]
    docs = [ln for ln in lines if ln.startswith("Docs: docs/")]
    assert len(question) == len(records) == len(docs) == 1, (
        f"{path.name}: one 'Question:', 'Records:' and 'Docs:' line each"
    )
    # A field runs on to the next field or blank line: the records may continue on the next line.
    i = lines.index(records[0])
    record_text = " ".join(lines[i : lines.index(docs[0])])
    named = re.findall(r"bench/results/[\w./\-]+\.json", record_text)
    assert named and all((ROOT / r).is_file() for r in named), named
    pages = [p.strip() for p in docs[0].removeprefix("Docs: ").split(",")]
    script = f"bench/investigations/{path.name}"
    for page in pages:
        text = (ROOT / page).read_text(encoding="utf-8")
        assert script in text, f"{page} quotes {path.name}'s record but does not name {script}"
        assert any(r in text or pathlib.Path(r).name in text for r in named), (
            f"{page} names none of {path.name}'s records"
        )
    section = README.read_text(encoding="utf-8").split(f"### [`investigations/{path.name}`]")[1]
    section = section.split("\n### ")[0]
    assert "- **Question:** " in section and all(f"`{p}`" in section for p in pages)


def _generated_tables_removed(text: str) -> str:
    """The text without its generated tables (``<!-- X:start -->`` … ``<!-- X:end -->``): they
    render records, whose ``command`` is the command as it was run."""
    return re.sub(r"<!-- ([\w.\-]+):start -->.*?<!-- \1:end -->", "", text, flags=re.S)


def test_every_bench_script_the_repository_names_exists():
    files = []
    for name in SCOPE:
        p = ROOT / name
        files += [p] if p.is_file() else [f for f in p.rglob("*") if f.suffix in (".py", ".md")]
    missing = []
    for f in files:
        if "results" in f.relative_to(ROOT).parts or f == pathlib.Path(__file__).resolve():
            continue  # records keep their commands as run; this file names scratch scripts
        text = _generated_tables_removed(f.read_text(encoding="utf-8", errors="replace"))
        for m in re.finditer(r"bench/((?:investigations/)?[a-z_0-9]+\.py)", text):
            if not (BENCH / m.group(1)).is_file():
                missing.append(f"{f.relative_to(ROOT)}: {m.group(0)}")
    assert not missing, missing


def _tree(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of bench/'s scripts (records and data left out) and of docs/, to break."""
    bench = tmp_path / "bench"
    (bench / "investigations").mkdir(parents=True)
    for p in [*BENCH.glob("*.py"), *(BENCH / "investigations").glob("*.py")]:
        shutil.copy(p, bench / p.relative_to(BENCH))
    shutil.copytree(BENCH / "results", bench / "results")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return bench


def test_the_generator_lists_a_new_script_and_refuses_an_investigation_without_its_fields(
    tmp_path,
):
    index = _index()
    bench = _tree(tmp_path)
    (bench / "stray.py").write_text('"""A stray benchmark.\n\nMore."""\n')
    text = index.render(bench)
    assert "| [`stray.py`](stray.py) | A stray benchmark. |" in text
    assert text != README.read_text(encoding="utf-8")  # the committed index has no stray entry

    (bench / "nodoc.py").write_text("x = 1\n")
    with pytest.raises(index.IndexProblem, match="bench/nodoc.py has no module docstring"):
        index.render(bench)
    (bench / "nodoc.py").unlink()

    inv = bench / "investigations" / "bare.py"
    inv.write_text('"""A question, asked.\n\nRecords: bench/results/row_stride.json\n"""\n')
    with pytest.raises(index.IndexProblem, match="no 'Question:', 'Docs:' line"):
        index.render(bench)
    inv.write_text(
        '"""A question, asked.\n\nQuestion: which?  Answered.\n'
        'Records: bench/results/row_stride.json\nDocs: docs/results/time-model.md\n"""\n'
    )
    with pytest.raises(index.IndexProblem, match="does not name `bench/investigations/bare.py`"):
        index.render(bench)
    inv.write_text(
        '"""A question, asked.\n\nQuestion: which?\nRecords: bench/results/none.json\n'
        'Docs: docs/results/time-model.md\n"""\n'
    )
    with pytest.raises(index.IndexProblem, match="'bench/results/none.json' is not a file"):
        index.render(bench)
