"""MkDocs hooks: the documentation's generated pages, made from the code at every build.

Nothing here is written to disk: the pages are added to the build (``on_files``) and the
``<!-- cli-options: VERB -->`` markers of the hand-written verb guides are replaced by that verb's
options as the argument parser states them (``on_page_markdown``), so the option lists, the model
and target catalogues, the layer table and the records index cannot drift from the code.

Generated pages:

* ``reference/cli.md``: every verb's usage and options (``tierax.cli.parsers.build_parser``).
* ``reference/models.md``: the named model configs (``tierax.models.NAMED_CONFIGS``).
* ``reference/targets.md``: the hardware targets (``tierax.hardware.gpus.TARGETS``,
  ``tierax.hardware.tpus.TPU_TARGETS``) with each figure's stated source.
* ``development/layers.md``: the layers as ``tests/test_layering.py`` states them (``LAYERS``,
  read with ``ast``), each package's modules and their docstrings' first lines.
* ``results/records.md``: every record under ``bench/results/`` with its schema, command and date,
  and the pages that cite it.
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(SRC) not in sys.path:  # the tree being documented, not an installed copy
    sys.path.insert(0, str(SRC))

CLI_MARKER = re.compile(r"<!-- cli-options: ([a-z-]+) -->")
# Tables a hand-written page places with a marker line, made from the code at build time.
TABLE_MARKERS = {
    "<!-- activation-names -->": "names_markdown",
    "<!-- plan-presets -->": "presets_markdown",
}
GENERATED = (
    "reference/cli.md",
    "reference/models.md",
    "reference/targets.md",
    "development/layers.md",
    "results/records.md",
)
# Images the docs show that live with their record under bench/results/ (copied into the build).
RESULT_IMAGES = ("whatif-deepseek-v3.png",)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text) -> str:
    return f"`{_cell(text)}`" if text else ""


# --------------------------------------------------------------------------- the CLI


def verb_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every verb of ``tierax`` and its parser, in the order ``tierax --help`` lists them."""
    from tierax.cli.parsers import build_parser

    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise RuntimeError("tierax's parser has no verbs")


def _option_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str, str]]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            name = ", ".join(f"`{s}`" for s in action.option_strings)
        else:
            name = f"`{action.metavar or action.dest}` (positional)"
        if action.nargs == 0:
            value = ""
        elif action.choices is not None:
            value = " \\| ".join(f"`{c}`" for c in action.choices)
        else:
            value = f"`{action.metavar or action.dest.upper()}`"
        if action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction):
            value += " (repeatable)" if action.option_strings else " (one or more)"
        default = ""
        if action.default not in (None, False, argparse.SUPPRESS, []) and action.nargs != 0:
            default = f"`{action.default}`"
        if action.required:
            default = "required"
        help_text = formatter._expand_help(action) if action.help else ""
        rows.append((name, value, default, help_text))
    return rows


def options_markdown(verb: str, parser: argparse.ArgumentParser) -> str:
    """One verb's usage line and a table of every option (what ``--help`` prints, as Markdown)."""
    usage = parser.format_usage().strip().removeprefix("usage: ")
    lines = [
        f"```text\n{usage}\n```",
        "",
        _cell(parser.description or ""),
        "",
        "| option | value | default | what it does |",
        "|---|---|---|---|",
    ]
    lines += [f"| {n} | {v} | {d} | {_cell(h)} |" for n, v, d, h in _option_rows(parser)]
    return "\n".join(lines) + "\n"


def cli_page() -> str:
    parsers = verb_parsers()
    out = [
        "# Command-line reference",
        "",
        "Generated at every docs build from the argument parser (`tierax.cli.parsers`), so it "
        "lists exactly what `tierax VERB --help` accepts. Each verb's task guide explains when "
        "to use which option.",
        "",
    ]
    for verb, parser in parsers.items():
        out += [f"## `tierax {verb}`", "", f"Task guide: [{verb}](../guide/{verb}.md).", ""]
        out.append(options_markdown(verb, parser))
    return "\n".join(out)


# --------------------------------------------------------------------------- catalogues


def _count(n: int) -> str:
    return f"{n / 1e9:.3f} B" if n >= 1e9 else f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n:,}"


def models_page() -> str:
    from tierax.models import NAMED_CONFIGS

    out = [
        "# Model catalogue",
        "",
        "The named configs `--model NAME` accepts, generated from `tierax.models.NAMED_CONFIGS` "
        "(what `tierax models` prints). `tierax models show NAME` prints one as a YAML file "
        "that `--model-config` accepts; `--set KEY=VALUE` overrides a field.",
        "",
        "| name | family | layers | d_model | layer groups | parameters | activated per token |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, cfg in NAMED_CONFIGS.items():
        groups = ", ".join(f"`{g.name}` × {g.num_layers}" for g in cfg.layer_groups())
        out.append(
            f"| `{name}` | {cfg.family} | {cfg.num_layers} | {cfg.d_model} | {groups} | "
            f"{_count(cfg.param_count())} | {_count(cfg.activated_param_count())} |"
        )
    return "\n".join(out) + "\n"


def targets_page() -> str:
    from tierax.hardware.gpus import TARGETS
    from tierax.hardware.tpus import TPU_TARGETS

    out = [
        "# Hardware targets",
        "",
        "The targets `--target` accepts, generated from the code's tables "
        "(`tierax.hardware.gpus.TARGETS`, `tierax.hardware.tpus.TPU_TARGETS`). Figures are per "
        "device (GPU or TPU chip); peak FLOP/s are dense. A *projection* is a part XLA has no "
        "device description for: the cost model runs, no deviceless compile is offered. `cpu` "
        "is a further target once `tierax calibrate` has measured this machine. The cost "
        "model's TPU kernel rates (GEMMs, the splash kernel, a layer's non-matmul work, v5e's "
        "host link) are those measured on a v5e chip, other generations' scaled by their "
        "datasheet: [TPU kernel rates measured on a v5e chip](../results/tpu-kernel-rates.md).",
        "",
        "| key | device | memory GB | HBM TB/s | peak bf16 TFLOP/s | host link GB/s "
        "(per direction) | host link source | deviceless compile |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, spec in {**TARGETS, **TPU_TARGETS}.items():
        compiles = "no (projection: " + _cell(spec.projection) + ")" if spec.projection else "yes"
        out.append(
            f"| `{key}` | {_cell(spec.name)} | {spec.device_memory_bytes / 1e9:.1f} | "
            f"{spec.hbm_bytes_per_s / 1e12:.2f} | {spec.peak('bfloat16') / 1e12:.0f} | "
            f"{spec.host_link_bps / 1e9:.0f} | {_cell(spec.host_link_source)} | {compiles} |"
        )
    return "\n".join(out) + "\n"


def names_markdown() -> str:
    """The closed set of activation names, as ``tierax/names.py`` groups and describes them."""
    section, rows = "", []
    for line in (SRC / "tierax" / "names.py").read_text().splitlines():
        comment = re.match(r"^# (.+)", line)
        if comment:
            section = comment.group(1).rstrip(".")
        name = re.match(r'^[A-Z0-9_]+ = "([a-z0-9_]+)"(?:\s*#\s*(.*))?$', line)
        if name:
            rows.append(f"| `{name.group(1)}` | {_cell(section)} | {_cell(name.group(2) or '')} |")
    from tierax.names import ALL_NAMES

    listed = {r.split("`")[1] for r in rows}
    if listed != set(ALL_NAMES):
        raise RuntimeError(
            f'tierax/names.py: names not read as NAME = "...": {set(ALL_NAMES) ^ listed}'
        )
    return "\n".join(["| name | where | what it is |", "|---|---|---|", *rows]) + "\n"


def presets_markdown() -> str:
    """Each preset resolved for the two tiny reference configs (one per family), per activation."""
    from tierax.models import NAMED_CONFIGS
    from tierax.plan import PRESETS, preset
    from tierax.plan.types import resolve

    out = ["| preset | what it keeps |", "|---|---|"]
    out += [f"| `{name}` | {_cell(desc)} |" for name, (desc, _) in PRESETS.items()]
    for model in ("tiny-llama", "tiny-deepseek"):
        cfg = NAMED_CONFIGS[model]
        resolved = {name: resolve(preset(name, cfg), cfg) for name in PRESETS}
        first = next(iter(resolved.values()))
        out += ["", f"Resolved for `{model}` (`tierax plans --model {model} --show PRESET`):", ""]
        out += ["| group | activation | " + " | ".join(f"`{n}`" for n in PRESETS) + " |"]
        out += ["|---|---|" + "---|" * len(PRESETS)]
        for group, acts in first.items():
            for act in acts:
                cells = " | ".join(resolved[n][group][act].value for n in PRESETS)
                out.append(f"| {group} | `{act}` | {cells} |")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- the layers


def stated_layers() -> list[list[str]]:
    """``LAYERS`` of ``tests/test_layering.py``, lowest first, read without importing the test."""
    tree = ast.parse((ROOT / "tests" / "test_layering.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "LAYERS" for t in targets):
                return [sorted(layer) for layer in ast.literal_eval(node.value)]
    raise RuntimeError("tests/test_layering.py states no LAYERS")


def _first_line(path: pathlib.Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def package_units() -> dict[str, list[pathlib.Path]]:
    """Each top-level unit of ``src/tierax`` (a package or module) and its Python files."""
    pkg = SRC / "tierax"
    units: dict[str, list[pathlib.Path]] = {}
    for path in sorted(pkg.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            units[path.name] = sorted(path.rglob("*.py"))
        elif path.suffix == ".py" and path.name not in ("__init__.py", "__main__.py"):
            units[path.stem] = [path]
    return units


def layers_page() -> str:
    layers = stated_layers()
    units = package_units()
    placed = {u for layer in layers for u in layer}
    missing = sorted(set(units) - placed)
    if missing:  # tests/test_layering.py fails on these too; the docs refuse to hide them
        raise RuntimeError(f"packages in no layer of tests/test_layering.py: {', '.join(missing)}")
    out = [
        "# The layers",
        "",
        "Generated from `LAYERS` in `tests/test_layering.py` (which fails on any import that runs "
        "up a layer, or sideways between peers, and on a package placed in no layer) and the "
        "package tree under `src/tierax/`. Lowest first; a package imports only from the layers "
        "above it in this list.",
        "",
        "| layer | unit | modules (first line of each docstring) |",
        "|---|---|---|",
    ]
    for i, layer in enumerate(layers):
        for unit in layer:
            files = units.get(unit, [])
            mods = "<br>".join(
                f"`{p.relative_to(SRC).as_posix()}`: {_cell(_first_line(p))}" for p in files
            )
            out.append(f"| {i} | `{unit}` | {mods} |")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- records


def records_page(pages: dict[str, str]) -> str:
    """Every record under bench/results/ with its envelope, and the pages that mention it."""
    out = [
        "# Records",
        "",
        "Every JSON record under `bench/results/`, generated from the files at build time: the "
        "schema, the command that wrote it and when (the record's own envelope; a blank is a "
        "field the record lacks), and the documentation pages that cite it. The measured figures "
        "the pages quote come from these files.",
        "",
        "| record | schema | created | jax | command | cited on |",
        "|---|---|---|---|---|---|",
    ]
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        doc = json.loads(path.read_text())
        doc = doc if isinstance(doc, dict) else {}
        command = doc.get("command") or doc.get("bench") or ""
        cited = [
            f"[{uri.removesuffix('.md')}](../{uri})"
            for uri, text in sorted(pages.items())
            if path.name in text and uri != "results/records.md"
        ]
        out.append(
            f"| `{path.name}` | {_code(doc.get('schema'))} | {_cell(doc.get('created', ''))} | "
            f"{_cell(doc.get('jax_version', ''))} | {_code(command)} | "
            f"{', '.join(cited)} |"
        )
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- MkDocs hooks


def on_files(files, config):
    from mkdocs.structure.files import File

    pages = {
        f.src_uri: pathlib.Path(f.abs_src_path).read_text()
        for f in files
        if f.src_uri.endswith(".md") and f.abs_src_path
    }
    generated = {
        "reference/cli.md": cli_page(),
        "reference/models.md": models_page(),
        "reference/targets.md": targets_page(),
        "development/layers.md": layers_page(),
    }
    pages.update(generated)
    generated["results/records.md"] = records_page(pages)
    assert tuple(generated) == GENERATED
    for uri, text in generated.items():
        files.append(File.generated(config, uri, content=text))
    for name in RESULT_IMAGES:
        image = (ROOT / "bench" / "results" / name).read_bytes()
        files.append(File.generated(config, f"results/{name}", content=image))
    return files


def on_page_markdown(markdown, page, config, files):
    parsers = None

    def options(match: re.Match) -> str:
        nonlocal parsers
        parsers = parsers or verb_parsers()
        verb = match.group(1)
        if verb not in parsers:
            raise RuntimeError(
                f"{page.file.src_uri}: no verb {verb!r}; tierax's verbs: {', '.join(parsers)}"
            )
        return options_markdown(verb, parsers[verb])

    markdown = CLI_MARKER.sub(options, markdown)
    for marker, function in TABLE_MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, globals()[function]())
    return markdown
