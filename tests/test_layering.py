"""The package's layers, stated by package: every import (lazy ones inside functions included) runs
down the pipeline or within one package, never up and never sideways between peers, and no
import (lazy ones included) closes a cycle between two packages.

The layers, lowest first.  A package or module of ``src/tierax/`` that is in none of them fails the
test: a new stage is placed here on purpose.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "tierax"

LAYERS: list[set[str]] = [
    # foundations
    {"errors"},
    {"names"},
    {"sizes"},
    {"fileio"},
    {"schema"},
    {"records"},
    {"mesh"},
    {"hardware"},
    {"sharding"},
    # the pipeline's stages
    {"models"},
    {"plan"},
    {"tracing"},
    {"costmodel"},
    {"launch"},
    {"interop"},
    {"train"},
    {"xla", "measure"},  # peers: neither imports the other
    {"solving"},
    {"calibration"},  # fits the cost model to measured runs (uses interop's plans)
    {"report"},
    # entry points
    {"cli", "api"},
    {"__main__"},  # python -m tierax: the command
]
LAYER = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: pathlib.Path) -> list[tuple[str, int, bool]]:
    """(imported tierax module or attribute path, line, at module level) for every import."""
    tree = ast.parse(path.read_text())
    top_level = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        at_top = id(node) in top_level
        if isinstance(node, ast.ImportFrom):
            if node.level:
                package = _module_name(path)
                package = package if path.name == "__init__.py" else package.rsplit(".", 1)[0]
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "tierax" or module.startswith("tierax."):
                for alias in node.names:
                    found.append((f"{module}.{alias.name}", node.lineno, at_top))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tierax"):
                    found.append((alias.name, node.lineno, at_top))
    return found


def _unit(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else None


def _sources() -> list[pathlib.Path]:
    return sorted(p for p in PKG.rglob("*.py") if p != PKG / "__init__.py")


def test_every_package_is_in_a_layer():
    units = {p.stem if p.parent == PKG else p.relative_to(PKG).parts[0] for p in _sources()}
    missing = sorted(units - set(LAYER))
    assert not missing, f"place these in tests/test_layering.py's LAYERS: {missing}"
    stale = sorted(set(LAYER) - units)
    assert not stale, f"LAYERS names packages that no longer exist: {stale}"


def _violations(module: str, imports: list[tuple[str, int, bool]]) -> list[str]:
    here, bad = _unit(module), []
    for target, line, _ in imports:
        there = _unit(target)
        if there is None or there == here or there not in LAYER:
            continue  # ``from tierax import f`` of a name that is no package: nothing to place
        if LAYER[there] >= LAYER[here]:
            bad.append(f"{module}:{line} ({here}) imports {target} ({there})")
    return bad


def test_no_import_runs_up_a_layer_or_between_peers():
    bad = [v for p in _sources() for v in _violations(_module_name(p), _imports(p))]
    assert not bad, "imports up a layer or between peers:\n" + "\n".join(bad)


def test_imports_have_no_cycle():
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for target, _, _ in _imports(path):  # lazy imports count: still a dependency
            # ``from a.b import c``: the module a.b.c where it exists, else a.b
            deps.add(target if target in modules else target.rsplit(".", 1)[0])
        graph[name] = {d for d in deps if d in modules and d != name}
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    # a package's facade importing its own submodules, which import the facade's package name, is
    # how Python packages work; a cycle between two different packages is not
    cross = [c for c in cycles if len({_unit(m) for m in c.split(" -> ")}) > 1]
    assert not cross, "import cycles:\n" + "\n".join(cross)


@pytest.mark.parametrize(
    "module, source",
    [
        ("tierax.costmodel.fixed", "def f():\n    from tierax.train import step\n"),
        ("tierax.tracing.hbm", "from tierax import solving\n"),
        ("tierax.xla.compile", "from tierax.measure import harness\n"),
        ("tierax.errors", "import tierax.cli\n"),
    ],
)
def test_the_rule_sees_an_upward_or_sideways_import(tmp_path, module, source):
    """The check itself can fail: a lazy upward import, a package imported by name, a peer."""
    f = tmp_path / "x.py"
    f.write_text(source)
    assert _violations(module, _imports(f)), source
    assert not _violations("tierax.cli.main", _imports(f))  # the top imports anything
