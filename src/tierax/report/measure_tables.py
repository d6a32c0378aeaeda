"""Rich tables for the measuring verbs: ``verify`` and ``profile``."""

from __future__ import annotations

from rich.table import Table


def verify_table(results, title: str) -> Table:
    t = Table(
        title=title, caption="error per leaf: max|g − g_save-all| / max|g_save-all|; loss: relative"
    )
    for col in ("plan", "result", "max rel. error", "tolerance", "loss rel. error", "worst leaves"):
        t.add_column(col, justify="right" if "error" in col or col == "tolerance" else "left")
    for r in results:
        worst = (
            ", ".join(f"{w.path} ({w.rel_err:.2g})" for w in r.worst_leaves if w.rel_err != 0)
            or "all equal"
        )
        t.add_row(
            r.plan,
            "[green]pass[/]" if r.passed else "[red]FAIL[/]",
            f"{r.max_rel_err:.3g}",
            f"{r.tolerance:g}",
            f"{r.loss_rel_err:.3g}",
            worst,
        )
    return t


def _ms(x) -> str:
    return "—" if x is None else f"{x * 1e3:.3f}"


def _gbs(x) -> str:
    return "—" if x is None else f"{x / 1e9:.1f}"


def profile_table(analysis, title: str) -> Table:
    cpu = analysis.backend == "cpu"
    t = Table(title=title, caption="; ".join(analysis.notes) or None)
    cols = [
        "step",
        "device",
        "wall ms",
        "compute ms",
        "D→H ms",
        "D→H GB/s",
        "H→D ms",
        "H→D GB/s",
        "overlap ms",
        "exposed ms",
    ]
    for c in cols:
        t.add_column(c, justify="left" if c == "device" else "right")
    for s in analysis.steps:
        na = "n/a" if cpu else None
        t.add_row(
            str(s.step),
            s.device,
            _ms(s.wall_s),
            _ms(s.compute_s),
            na or _ms(s.d2h.busy_s),
            na or _gbs(s.d2h.bandwidth_bytes_per_s),
            na or _ms(s.h2d.busy_s),
            na or _gbs(s.h2d.bandwidth_bytes_per_s),
            na or _ms(s.overlap_s),
            na or _ms(s.exposed_s),
        )
    return t
