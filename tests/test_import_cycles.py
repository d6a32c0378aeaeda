"""No import circles between tierax's modules: the graph of every ``import`` in ``src/tierax``
(module-level, function-level and under ``TYPE_CHECKING``, read with ``ast``, nothing imported) has
no cycle.  A circle means two modules each hold part of the other's concept; it is broken by moving
what they share to where it belongs, not by deferring one import into a function (which this graph
still sees).

A package's ``__init__`` is left out: a facade imports its package's modules, which may import
siblings through it (``from tierax import costmodel as cm``), and that is the facade's purpose, not
a circle between concepts."""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"


def modules(root: pathlib.Path) -> dict[str, tuple[pathlib.Path, bool]]:
    """Every module under ``root`` (a package directory): dotted name → (file, is a package)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, package)
    return out


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    """Module → the modules of ``root``'s tree it imports anywhere in its file (``from P import
    N`` is an import of ``P.N`` where that is a module, else of ``P``); packages' ``__init__``
    neither import nor are imported here."""
    mods = modules(root)
    graph: dict[str, set[str]] = {}
    for name, (path, package) in mods.items():
        if package:
            continue
        here = name.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package ``level - 1`` steps above ``here``
                    up = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]  # fmt: skip
            else:
                continue
            edges |= {t for t in targets if t in mods and not mods[t][1] and t != name}
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path, first module repeated last) per strongly connected component of more
    than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [[min(comp), *_way_back(graph, comp, min(comp))] for comp in components]


def _way_back(graph: dict[str, set[str]], comp: set[str], start: str) -> list[str]:
    """The modules of a shortest path from ``start`` back to itself inside ``comp`` (breadth first;
    ``start`` last)."""
    prev: dict[str, str] = {}
    frontier = [start]
    while start not in prev:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    path, v = [start], prev[start]
    while v != start:
        path.append(v)
        v = prev[v]
    return path[::-1]


def test_no_module_of_tierax_imports_itself_back():
    found = cycles(import_graph(SRC / "tierax"))
    assert not found, "import circles (move what the modules share to where it belongs):\n" + (
        "\n".join(" → ".join(c) for c in found)
    )


def _write(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root / "pkg"


@pytest.mark.parametrize(
    "files, expected",
    [
        (  # a function-level import closes it: still a circle
            {
                "pkg/__init__.py": "",
                "pkg/sub/__init__.py": "from pkg.sub import a",
                "pkg/sub/a.py": "from pkg.sub.b import f\n",
                "pkg/sub/b.py": "def f():\n    from pkg.sub import a\n",
            },
            [["pkg.sub.a", "pkg.sub.b", "pkg.sub.a"]],
        ),
        (  # three modules, relative and TYPE_CHECKING imports
            {
                "pkg/__init__.py": "",
                "pkg/x.py": "from . import y\n",
                "pkg/y.py": "from .z import g\n",
                "pkg/z.py": "import typing\nif typing.TYPE_CHECKING:\n    import pkg.x\n",
            },
            [["pkg.x", "pkg.y", "pkg.z", "pkg.x"]],
        ),
        (  # through a facade only: not a circle between modules
            {
                "pkg/__init__.py": "from pkg import a, b",
                "pkg/a.py": "import pkg\n",
                "pkg/b.py": "from pkg import a\n",
            },
            [],
        ),
    ],
)
def test_the_graph_finds_circles(tmp_path, files, expected):
    assert cycles(import_graph(_write(tmp_path, files))) == expected
