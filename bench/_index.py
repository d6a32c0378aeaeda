#!/usr/bin/env python3
"""The index of bench/ (bench/README.md), generated from the scripts' module docstrings.

    python bench/_index.py            # rewrites bench/README.md
    python bench/_index.py --check    # exit 1 if bench/README.md is not what this would write

Every ``*.py`` under ``bench/`` and ``bench/investigations/`` has an entry: its purpose is the
first paragraph of its docstring.  The benchmarks a maintainer reruns stand in ``bench/``; the
finished investigations in ``bench/investigations/``, and each of those states in its docstring,
one field a line (a field runs on to the next field or the next blank line)::

    Question: the question it answered, and the answer.
    Records: bench/results/NAME.json[, bench/results/OTHER.json]
    Docs: docs/PAGE.md[, docs/OTHER.md]

where every record exists and every docs page names the script (``bench/investigations/NAME.py``),
so the investigation is found from the page that quotes it.  A script without a docstring, or an
investigation without its fields, is refused (exit 2) before anything is written.  Reads the
files as text: nothing is imported or run.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import pathlib
import re
import sys

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
INVESTIGATIONS = BENCH / "investigations"
README = BENCH / "README.md"
FIELDS = ("Question", "Records", "Docs")


class IndexProblem(ValueError):
    """A script the index cannot describe: the message names the file and what to add."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One script of bench/: its path relative to bench/, its purpose and, for an investigation,
    its question, records and docs pages (repository-relative paths)."""

    path: str
    purpose: str
    question: str = ""
    records: tuple[str, ...] = ()
    docs: tuple[str, ...] = ()


def scripts(bench: pathlib.Path = BENCH) -> list[pathlib.Path]:
    """Every ``*.py`` of ``bench/`` and ``bench/investigations/``, sorted."""
    return sorted([*bench.glob("*.py"), *(bench / "investigations").glob("*.py")])


def _markdown(text: str) -> str:
    """A docstring's text on one line, its reStructuredText literals as Markdown code."""
    return " ".join(text.split()).replace("``", "`")


def _fields(doc: str) -> dict[str, str]:
    """The ``Question:``/``Records:``/``Docs:`` fields of a docstring (each runs on to the next
    field or blank line)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in doc.splitlines():
        m = re.match(rf"({'|'.join(FIELDS)})(?: \([^)]*\))?: (.*)$", line)
        if m:
            current = m.group(1)
            found.setdefault(current, []).append(m.group(2))
        elif not line.strip():
            current = None
        elif current:
            found[current].append(line)
    return {k: " ".join(" ".join(v).split()) for k, v in found.items()}


def entry(path: pathlib.Path, bench: pathlib.Path = BENCH) -> Entry:
    """The index entry of one script, read from its docstring.

    Raises:
      IndexProblem: no docstring; for an investigation, a missing field, a record or docs page
        that does not exist, or a docs page that does not name the script.
    """
    rel = path.relative_to(bench).as_posix()
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    if not doc:
        raise IndexProblem(f"bench/{rel} has no module docstring; start it with its purpose")
    purpose = _markdown(doc.split("\n\n", 1)[0])
    if path.parent.name != "investigations":
        return Entry(rel, purpose)
    fields = _fields(doc)
    missing = [f for f in FIELDS if not fields.get(f)]
    if missing:
        raise IndexProblem(
            f"bench/{rel} is an investigation but its docstring has no "
            + ", ".join(f"'{f}:'" for f in missing)
            + " line; state the question it answered, its records under bench/results/ and the"
            " docs pages that quote them"
        )
    root = bench.parent
    records = tuple(r.strip() for r in fields["Records"].split(","))
    docs = tuple(d.strip() for d in fields["Docs"].split(","))
    for r in records:
        if not r.startswith("bench/results/") or not (root / r).is_file():
            raise IndexProblem(f"bench/{rel}: its record {r!r} is not a file under bench/results/")
    for d in docs:
        page = root / d
        if not d.startswith("docs/") or not page.is_file():
            raise IndexProblem(f"bench/{rel}: its docs page {d!r} is not a file under docs/")
        if f"bench/{rel}" not in page.read_text(encoding="utf-8"):
            raise IndexProblem(
                f"bench/{rel}: {d} does not name `bench/{rel}`; name the script where the page "
                "quotes its record"
            )
    return Entry(rel, purpose, _markdown(fields["Question"]), records, docs)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(bench: pathlib.Path = BENCH) -> str:
    """bench/README.md's text for the scripts as they are (see :func:`entry` for what it raises)."""
    entries = [entry(p, bench) for p in scripts(bench)]
    shared = [e for e in entries if e.path.startswith("_")]
    benchmarks = [e for e in entries if "/" not in e.path and not e.path.startswith("_")]
    investigations = [e for e in entries if e.path.startswith("investigations/")]
    lines = [
        "# bench/",
        "",
        "Generated by `python bench/_index.py` from each script's module docstring (its first",
        "paragraph is the purpose); `tests/test_bench_index.py` fails when a script has no entry,",
        "an entry names no script, or this file is stale. Every script answers `--help`; records",
        "are written under `results/` (the docs pages quote them), inputs are under `data/`.",
        "",
        "## Benchmarks",
        "",
        "What a maintainer reruns: `python bench/NAME.py` from the repository root.",
        "",
        "| script | purpose |",
        "|---|---|",
        *(f"| [`{e.path}`]({e.path}) | {_cell(e.purpose)} |" for e in benchmarks),
        "",
        "## Investigations",
        "",
        "Finished: each answered its question, and a docs page quotes its record (records keep",
        "their paths under `results/`). They still run: `python bench/investigations/NAME.py`.",
    ]
    for e in investigations:
        lines += [
            "",
            f"### [`{e.path}`]({e.path})",
            "",
            e.purpose,
            "",
            f"- **Question:** {e.question}",
            "- **Records:** " + ", ".join(f"[`{r}`](../{r})" for r in e.records),
            "- **Quoted by:** " + ", ".join(f"[`{d}`](../{d})" for d in e.docs),
        ]
    lines += [
        "",
        "## Shared modules",
        "",
        "| module | purpose |",
        "|---|---|",
        *(f"| [`{e.path}`]({e.path}) | {_cell(e.purpose)} |" for e in shared),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if bench/README.md is stale"
    )
    args = ap.parse_args(argv)
    try:
        text = render()
    except IndexProblem as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        if README.is_file() and README.read_text(encoding="utf-8") == text:
            print(f"{README.relative_to(ROOT)} is up to date")
            return 0
        print(f"{README.relative_to(ROOT)} is stale: run python bench/_index.py", file=sys.stderr)
        return 1
    tmp = README.with_name(".README.md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(README)  # whole or not at all
    print(f"wrote {README.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
