"""The package's layering: a module imports only from its own layer or lower ones, and no import
cycles.

Imports inside functions count too: a lazy import is still a dependency.
"""

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"

# Lowest first.  A module belongs to the first layer with a prefix that matches it.
LAYERS = [
    (
        "foundation",
        (
            "tierax.errors",
            "tierax.names",
            "tierax.fileio",
            "tierax.records",
            "tierax.schema",
            "tierax.mesh",
        ),
    ),
    (
        "models, plans, targets",
        (
            "tierax.xla_flags",
            "tierax.cudnn",
            "tierax.hardware",
            "tierax.target_config",
            "tierax.network",
            "tierax.models",
            "tierax.plan",
            "tierax.jaxpr_tools",
        ),
    ),
    # tierax.interop, other tools' formats, is one layer with the planner (its planning module
    # plans for another tool); the core loaders below it read only tierax's own formats.
    (
        "analysis and training",
        (
            "tierax.inventory",
            "tierax.hbm",
            "tierax.costmodel",
            "tierax.planner",
            "tierax.hlo",
            "tierax.train",
            "tierax.interop",
            "tierax.planning",
            "tierax.mesh_search",
            "tierax.api",
            "tierax.whatif",
        ),
    ),
    (
        "running and measuring",
        (
            "tierax.launch",
            "tierax.compile",
            "tierax.compile_oom",
            "tierax.compile_result",
            "tierax.plan_check",
            "tierax.bench",
            "tierax.measure",
        ),
    ),
    ("reporting", ("tierax.report",)),
    ("command line", ("tierax.cli",)),
]


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    if module == "tierax":  # the package's facade (the Python API) sits just below the command line
        return len(LAYERS) - 2
    raise AssertionError(f"{module} is in no layer; add it to LAYERS in {__file__}")


def _imports(path: pathlib.Path, module: str) -> set[str]:
    """tierax modules imported anywhere in the file (``from tierax import x`` counts as tierax.x
    when x is a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("tierax")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tierax"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in MODULES else node.module)
    out.discard(module)
    return out


MODULES = {_module_name(p): p for p in sorted((SRC / "tierax").rglob("*.py"))}
GRAPH = {m: _imports(p, m) for m, p in MODULES.items()}


def test_every_module_is_in_a_layer():
    assert len(MODULES) > 40  # the package was found
    assert all(
        0 <= _layer(m) < len(LAYERS) for m in MODULES
    )  # _layer raises, naming a module in no layer


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_reaches_up_a_layer(module):
    mine = _layer(module)
    up = sorted(d for d in GRAPH[module] if d in MODULES and _layer(d) > mine)
    assert not up, f"{module} (layer {LAYERS[mine][0]!r}) imports higher layers: " + ", ".join(
        f"{d} ({LAYERS[_layer(d)][0]})" for d in up
    )


def test_no_import_cycles():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(GRAPH.get(m, ())):
            if d not in MODULES or d == "tierax":
                continue
            if state.get(d) == 1:
                cycle = stack[stack.index(d) :] + [d]
                raise AssertionError("import cycle: " + " → ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m)
    assert all(v == 2 for v in state.values())  # every module's imports were walked to the end


def test_the_checker_sees_a_violation(tmp_path):
    # The checker itself must be able to fail: a foundation module importing the CLI is caught.
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from tierax.cli import main\n")
    assert "tierax.cli" in _imports(f, "tierax.errors")
    assert _layer("tierax.cli") > _layer("tierax.errors")
