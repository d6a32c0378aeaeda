"""``tierax report``: charts, a Markdown summary and the README's performance table, from recorded
results.

Inputs are JSON records written by ``tierax bench --out`` (schema ``tierax.bench/1``)
or ``bench/gpu_check.py`` (``tierax.gpu-check/1``), and optionally a profiler trace
(``tierax profile --out DIR``).  Everything is read and checked before anything is
written; files are rendered in a temporary directory and moved into place, so a
failed report leaves no half-written output.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from tierax.errors import TieraxError
from tierax.fileio import check_output_dir, make_temp_dir, write_text_atomic
from tierax.records import (
    BENCH_SCHEMA,
    GPU_CHECK_SCHEMA,
    SWEEP_SCHEMA,
    WHATIF_SCHEMA,
    finite,
    load_record,
)

SCHEMAS = (BENCH_SCHEMA, GPU_CHECK_SCHEMA)
README_START = "<!-- perf-table:start -->"
README_END = "<!-- perf-table:end -->"

# Memory figures in order of preference; a chart uses the first one every record has.
MEMORY_SOURCES = (
    ("peak_device_bytes_runtime", "runtime peak (memory_stats)"),
    ("peak_device_bytes_compiled", "compiled peak (XLA memory_analysis)"),
    ("compiled_temp_bytes", "compiled temp (XLA memory_analysis)"),
)


@dataclass(frozen=True)
class Results:
    """One results file, validated."""

    path: pathlib.Path
    doc: dict
    kind: str  # bench | gpu-check

    @property
    def stem(self) -> str:
        return self.path.stem

    def records(self) -> list[dict]:
        """Per-plan records; gpu-check runs are flattened with their ``xla_preset``."""
        if self.kind == "bench":
            return list(self.doc.get("records") or [])
        out = []
        for run in self.doc.get("runs", []):
            for r in run.get("records", []):
                out.append(dict(r) | {"xla_preset": run.get("xla_preset", "?")})
        return out


def load_results(path: str | os.PathLike) -> Results:
    """Read and check one results file.

    Raises:
      TieraxError: missing file, not JSON, or a schema this tierax does not read.
    """
    p = pathlib.Path(path)
    doc = load_record(
        p, SCHEMAS, hint="give a file written by `tierax bench --out FILE` (or bench/gpu_check.py)"
    )
    schema = doc["schema"]
    kind = "bench" if schema == BENCH_SCHEMA else "gpu-check"
    res = Results(p, doc, kind)
    recs = res.records()
    if not recs:
        raise TieraxError(f"results file {str(p)!r} holds no per-plan records; nothing to report")
    for r in recs:
        missing = [k for k in ("plan", "step_time_s", "tokens_per_s") if k not in r]
        if missing:
            raise TieraxError(
                f"results file {str(p)!r}: a record lacks {', '.join(missing)}; the file is "
                "damaged or was edited by hand — re-run the benchmark"
            )
        bad = [
            k
            for k in ("step_time_s", "tokens_per_s")
            if r[k] is not None and not (finite(r[k]) and r[k] > 0)
        ]
        if bad:
            raise TieraxError(
                f"results file {str(p)!r}: plan {r['plan']!r} has {bad[0]} = {r[bad[0]]!r}, not a "
                "positive number; the run was broken — re-run the benchmark"
            )
    return res


def memory_axis(records: Sequence[dict]) -> tuple[str, str]:
    """(record key, label) of the best memory figure every record has."""
    for key, label in MEMORY_SOURCES:
        if all(isinstance(r.get(key), (int, float)) and r.get(key) for r in records):
            return key, label
    raise TieraxError(
        "the records carry no memory figure (runtime peak, compiled peak or compiled temp)"
    )


def fmt_bytes(n) -> str:
    if not isinstance(n, (int, float)):
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _machine(doc: dict) -> str:
    m = doc.get("machine", {})
    return (
        f"{m.get('device_count', '?')} × {m.get('device_kind', '?')} ({m.get('platform', '?')}), "
        f"jax {doc.get('jax_version', m.get('jax', '?'))}, python {m.get('python', '?')}"
    )


def _batch(doc: dict) -> str:
    mb = doc.get("microbatch_per_device", doc.get("microbatch", "?"))
    return f"microbatch {mb}/device × seq {doc.get('seq', '?')}"


def perf_table(res: Results) -> str:
    """The Markdown performance table of one results file (the README's perf-table section)."""
    recs = res.records()
    doc = res.doc
    has_peak = any(
        isinstance(r.get("peak_device_bytes_runtime"), int) or r.get("peak_device_bytes_compiled")
        for r in recs
    )
    gpu = res.kind == "gpu-check"
    head = (
        ["plan"]
        + (["XLA preset"] if gpu else [])
        + ["step ms", "tokens/s", "TFLOP/s/device", "MFU"]
    )
    head += ["peak memory/device"] if has_peak else []
    head += ["compiled temp", "planned act. on device", "to host", "recomputed"]
    head += ["exposed transfer ms", "grads verified"] if gpu else []
    head += ["loss"]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if h == "plan" or h == "XLA preset" else "---:" for h in head) + "|",
    ]
    for r in recs:
        row = [r["plan"]] + ([r.get("xla_preset", "?")] if gpu else [])
        ran = _num(r.get("step_time_s")) and _num(r.get("tokens_per_s"))
        row += [
            f"{r['step_time_s'] * 1e3:.1f}" if ran else "—",
            f"{r['tokens_per_s']:,.0f}" if ran else "—",
            f"{r['tflops_per_device']:.4g}" if _num(r.get("tflops_per_device")) else "—",
            f"{r['mfu']:.1%}" if _num(r.get("mfu")) else "—",
        ]
        if has_peak:
            if isinstance(r.get("peak_device_bytes_runtime"), int):
                peak = fmt_bytes(r["peak_device_bytes_runtime"]) + (
                    " (runtime)" if r.get("runtime_peak_exact", True) else " (runtime, ≤)"
                )
            elif r.get("peak_device_bytes_compiled"):
                peak = fmt_bytes(r.get("peak_device_bytes_compiled")) + " (compiled)"
            else:
                peak = "—"
            row.append(peak)
        row += [
            fmt_bytes(r.get("compiled_temp_bytes")),
            fmt_bytes(r.get("device_activation_bytes")),
            fmt_bytes(r.get("host_activation_bytes")),
            fmt_bytes(r.get("remat_activation_bytes")),
        ]
        if gpu:
            ex = r.get("exposed_transfer_s")
            row.append(f"{ex * 1e3:.2f}" if isinstance(ex, (int, float)) else "—")
            v = r.get("verified")
            row.append("—" if v is None else "yes" if v else "**NO**")
        row.append(f"{r['loss']:.4f}" if isinstance(r.get("loss"), (int, float)) else "—")
        lines.append("| " + " | ".join(row) + " |")
    model = doc.get("model", {}).get("name", "?")
    caption = (
        f"{model} · {_batch(doc)} · {_machine(doc)} · median of {doc.get('steps', '?')} steps. "
        f"Recorded {doc.get('created', '?')} by `{doc.get('command', '?')}`; "
        f"table generated from `{_display_path(res.path)}` by `tierax report`."
    )
    notes = []
    if doc.get("machine", {}).get("platform") == "cpu":
        notes.append(
            "On XLA:CPU offloading is a no-op: an offload plan runs as its save-on-device twin, "
            "so this table shows no offload effect."
        )
    return "\n".join([caption, "", *lines, *([""] + notes if notes else [])]) + "\n"


def _display_path(p: pathlib.Path) -> str:
    try:
        return str(p.resolve().relative_to(pathlib.Path.cwd().resolve()))
    except ValueError:
        return str(p)


def replace_marked_section(text: str, body: str, *, source: str = "README") -> str:
    """``text`` with everything between the perf-table markers replaced by ``body``.

    Raises:
      TieraxError: the markers are missing, repeated or out of order.
    """
    starts = [m.start() for m in re.finditer(re.escape(README_START), text)]
    ends = [m.start() for m in re.finditer(re.escape(README_END), text)]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise TieraxError(
            f"{source} needs exactly one '{README_START}' line followed by one '{README_END}' line "
            "around the generated performance table; add them where the table belongs"
        )
    head = text[: starts[0] + len(README_START)]
    return head + "\n" + body.rstrip("\n") + "\n" + text[ends[0] :]


def plotted(res: Results) -> list[dict]:
    """Records that ran (a throughput); plans skipped as not fitting are only listed in tables."""
    return [r for r in res.records() if _num(r.get("tokens_per_s"))]


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _series(res: Results, key: str) -> list:
    from tierax.report.plots import Point

    return [
        Point(
            r["plan"],
            float(r[key]),
            float(r["tokens_per_s"]),
            r.get("xla_preset", "") if res.kind == "gpu-check" else "",
        )
        for r in plotted(res)
    ]


def _trace_section(trace_path, out_tmp: pathlib.Path) -> tuple[str, list[str]]:
    """Analyse a trace; draw the last step's timeline; return (Markdown, files written)."""
    from tierax.measure import trace as trace_lib
    from tierax.report.plots import step_timeline

    events, f = trace_lib.load_events(trace_path)
    analysis = trace_lib.analyze(events, source=str(f))
    lanes, step, _ = trace_lib.timeline(events)
    cpu = analysis.backend == "cpu"
    shown = next((st for st in analysis.steps if st.step == step), None)
    summary = (
        ""
        if shown is None
        else (
            f"step {step} on {shown.device}: compute {_ms(shown.compute_s)} ms; transfers "
            f"{_ms(shown.transfer_s)} ms (D→H {_ms(shown.d2h.busy_s)} ms at "
            f"{_gbs(shown.d2h.bandwidth_bytes_per_s)} GB/s, H→D {_ms(shown.h2d.busy_s)} ms at "
            f"{_gbs(shown.h2d.bandwidth_bytes_per_s)} GB/s), overlapped with compute "
            f"{_ms(shown.overlap_s)} ms, exposed {_ms(shown.exposed_s)} ms"
        )
    )
    step_timeline(
        lanes,
        out_tmp / "timeline.png",
        title=f"one train step (step {step}) · {analysis.backend} trace · {pathlib.Path(f).name}",
        summary=summary
        if not cpu
        else "CPU trace: compute only; XLA:CPU has no host↔device transfers",
        empty_note="no host↔device transfers in this step" + (" (CPU backend)" if cpu else ""),
    )
    rows = [
        "| step | device | wall ms | compute ms | D→H ms | D→H GB/s | H→D ms | H→D GB/s | overlap "
        "ms | exposed ms |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for st in analysis.steps:
        na = "n/a" if cpu else None
        rows.append(
            f"| {st.step} | {st.device} | {_ms(st.wall_s)} | {_ms(st.compute_s)} | "
            f"{na or _ms(st.d2h.busy_s)} | {na or _gbs(st.d2h.bandwidth_bytes_per_s)} | "
            f"{na or _ms(st.h2d.busy_s)} | {na or _gbs(st.h2d.bandwidth_bytes_per_s)} | "
            f"{na or _ms(st.overlap_s)} | {na or _ms(st.exposed_s)} |"
        )
    md = [
        "## One step from the trace",
        "",
        f"Trace: `{f}` ({analysis.backend}).",
        "",
        "![timeline](timeline.png)",
        "",
        *rows,
        "",
    ]
    md += [f"- {n}" for n in analysis.notes]
    return "\n".join(md) + "\n", ["timeline.png"]


def _ms(x) -> str:
    return f"{x * 1e3:.3f}" if isinstance(x, (int, float)) else "—"


def _gbs(x) -> str:
    return f"{x / 1e9:.1f}" if isinstance(x, (int, float)) else "—"


def build_report(
    results: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    trace=None,
    readme: str | os.PathLike | None = None,
    command: str = "",
    sweeps: Sequence[str | os.PathLike] = (),
) -> list[pathlib.Path]:
    """Write the charts and ``summary.md`` into ``out_dir`` (and rewrite the README section if
    asked).

    Returns:
      The files written.

    Raises:
      TieraxError: a results file of another schema or damaged, a trace path with no
        trace, a README without the perf-table markers, an ``out_dir`` that is a file or not
        empty (as for every output directory: what is in it is the user's).  Nothing is written
        then.
    """
    check_output_dir(out_dir, allow_existing=False)
    if not results:
        raise TieraxError("give at least one results JSON (written by `tierax bench --out FILE`)")
    loaded = [load_results(r) for r in results]
    for r in loaded:
        if not plotted(r):
            raise TieraxError(f"results file {str(r.path)!r}: no plan ran (no throughput to chart)")
    axes = [memory_axis(plotted(r)) for r in loaded]
    frontiers = [load_sweep(f) for f in sweeps]
    if trace is not None:
        from tierax.measure.trace import find_trace_file

        find_trace_file(trace)  # a missing trace is an error before anything is written
    readme_path = pathlib.Path(readme) if readme else None
    new_readme = None
    if readme_path is not None:
        if not readme_path.is_file():
            raise TieraxError(f"--readme {str(readme_path)!r} does not exist")
        tables = "\n".join(perf_table(r) for r in loaded)
        new_readme = replace_marked_section(
            readme_path.read_text(), tables, source=str(readme_path)
        )

    out = pathlib.Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TieraxError(f"--out {str(out)!r} is a file; give a directory")
    tmp = make_temp_dir(out.parent, out.name)
    try:
        from tierax.report.plots import throughput_vs_memory

        names: list[str] = []
        md = ["# tierax report", ""]
        if command:
            md += [f"Generated by `{command}`.", ""]
        for res, (key, label) in zip(loaded, axes, strict=False):
            png = f"{res.stem}-throughput-vs-memory.png"
            doc = res.doc
            cpu = doc.get("machine", {}).get("platform") == "cpu"
            foot = f"{_machine(doc)}. Memory: {label}." + (
                " XLA:CPU ignores offloading: offload plans run as their save-on-device twins."
                if cpu
                else ""
            )
            throughput_vs_memory(
                _series(res, key),
                tmp / png,
                title=f"{doc.get('model', {}).get('name', '?')} · {_batch(doc)} · throughput vs "
                f"memory per plan",
                memory_label=label,
                footnote=foot,
            )
            names.append(png)
            md += [
                f"## {res.stem}",
                "",
                f"Source: `{_display_path(res.path)}` ({doc['schema']}).",
                "",
                f"![throughput vs memory]({png})",
                "",
                perf_table(res),
            ]
            if res.kind == "gpu-check":
                md += _gpu_check_notes(doc)
            if doc.get("verify"):
                md += [
                    "Gradient check before the benchmark (`--verify`): "
                    + ", ".join(
                        f"{v['plan']} {'passed' if v['passed'] else 'FAILED'} (max rel. err "
                        f"{v['max_rel_err']})"
                        for v in doc["verify"]
                    ),
                    "",
                ]
        if trace is not None:
            section, files = _trace_section(trace, tmp)
            md.append(section)
            names += files
        for path, sweep in frontiers:
            section, files = _sweep_section(path, sweep, tmp)
            md += section
            names += files
        (tmp / "summary.md").write_text("\n".join(md))
        names.append("summary.md")
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for n in names:
            os.replace(tmp / n, out / n)
            written.append(out / n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if new_readme is not None:
        write_text_atomic(readme_path, new_readme)
        written.append(readme_path)
    return written


def load_sweep(path: str | os.PathLike) -> tuple[pathlib.Path, dict]:
    """A planner frontier: a ``tierax plan --sweep --out`` record, or ``bench/whatif.py``'s (its
    ``sweep``).

    Raises:
      TieraxError: missing, not JSON, another schema, or no points.
    """
    p = pathlib.Path(path)
    doc = load_record(
        p, (SWEEP_SCHEMA, WHATIF_SCHEMA), hint="give `tierax plan --sweep ... --out F.png`'s F.json"
    )
    sweep = (
        doc
        if doc["schema"] == SWEEP_SCHEMA
        else {
            "title": f"{doc.get('model')} · {doc['sweep'].get('target')}",
            "references": ["remat-full", "save-all"],
        }
        | doc["sweep"]
    )
    key = sweep.get("sweep") or sweep.get("key")
    if not key or not sweep.get("points"):
        raise TieraxError(f"sweep record {str(p)!r} has no points; re-run `tierax plan --sweep`")
    return p, sweep | {"key": key}


def _sweep_section(
    path: pathlib.Path, sweep: dict, tmp: pathlib.Path
) -> tuple[list[str], list[str]]:
    from tierax.report.sweep_plot import plot_sweep

    png = f"{path.stem}-frontier.png"
    refs = sweep.get("references", [])
    plot_sweep(
        sweep["points"], sweep["key"], tmp / png, title=sweep.get("title", ""), references=refs
    )
    rows = [
        "| " + " | ".join([sweep["key"], "fits", "TFLOP/s/device", *refs, "plan change"]) + " |",
        "|" + "---:|" * (3 + len(refs)) + "---|",
    ]
    for pt in sweep["points"]:
        tf = f"{pt['tflops_per_device']:.1f}" if pt["fits"] else "—"
        ref = [f"{v:.1f}" if v is not None else "—" for v in (pt["reference"].get(r) for r in refs)]
        rows.append(
            "| "
            + " | ".join(
                [
                    f"{pt['value']:g}",
                    "yes" if pt["fits"] else "no",
                    tf,
                    *ref,
                    "; ".join(pt["changed"]),
                ]
            )
            + " |"
        )
    return [
        f"## Frontier: {path.stem}",
        "",
        f"Source: `{_display_path(path)}` (cost-model predictions).",
        "",
        f"![planner frontier]({png})",
        "",
        *rows,
        "",
    ], [png]


def _gpu_check_notes(doc: dict) -> list[str]:
    out = []
    link = doc.get("link") or {}
    if link:
        out.append(
            f"- host↔device copy bandwidth (pinned host): H→D {_gbs(link.get('h2d_bytes_per_s'))} "
            f"GB/s, D→H {_gbs(link.get('d2h_bytes_per_s'))} GB/s"
        )
    mm = doc.get("matmul") or {}
    if mm.get("flops_per_s"):
        out.append(f"- bf16 matmul: {mm['flops_per_s'] / 1e12:.0f} TFLOP/s ({mm.get('shape', '')})")
    if doc.get("planner"):
        out.append(f"- planner: {doc['planner'].get('status', '?')}")
    for n in doc.get("notes", []):
        out.append(f"- {n}")
    return out + [""] if out else []
