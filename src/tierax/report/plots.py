"""Charts for reports (matplotlib, Agg backend: no display needed).

* :func:`throughput_vs_memory` — one point per plan (and XLA preset): throughput
  against peak device memory, labelled without overlapping text.
* :func:`step_timeline` — one step's compute and host↔device transfers as lanes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


@dataclass(frozen=True)
class Point:
    """One plan's measurement: ``x_bytes`` of memory against ``y`` throughput."""

    plan: str
    x_bytes: float
    y: float
    series: str = ""  # e.g. the XLA preset; one marker shape per series


def _byte_unit(max_bytes: float) -> tuple[str, float]:
    return (
        ("GiB", 2.0**30)
        if max_bytes >= 2.0**30
        else ("MiB", 2.0**20)
        if max_bytes >= 2.0**20
        else ("KiB", 2.0**10)
    )


def _clusters(disp: Sequence[tuple[float, float]], radius: float = 14.0) -> list[list[int]]:
    """Indices of points closer than ``radius`` pixels, grouped (one label per group)."""
    groups: list[list[int]] = []
    for i, (x, y) in enumerate(disp):
        for g in groups:
            gx, gy = disp[g[0]]
            if abs(x - gx) < radius and abs(y - gy) < radius:
                g.append(i)
                break
        else:
            groups.append([i])
    return groups


def _cluster_label(points: Sequence[Point], idx: list[int]) -> str:
    plans = list(dict.fromkeys(points[i].plan for i in idx))
    series = [points[i].series for i in idx if points[i].series]
    if len(plans) == 1:
        return plans[0] + (" · " + ", ".join(dict.fromkeys(series)) if series else "")
    return "\n".join(
        f"{points[i].plan}" + (f" · {points[i].series}" if points[i].series else "") for i in idx
    )


def _place_labels(fig, ax, points: Sequence[Point], xy_data: Sequence[tuple[float, float]]) -> list:
    """Label each cluster of points at the first nearby spot overlapping no other label, marker or
    the axes edge.

    Returns the labels' bounding boxes (display coordinates).
    """
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    to_disp = ax.transData.transform
    disp = [tuple(to_disp(p)) for p in xy_data]
    axes_box = ax.get_window_extent(renderer)
    markers = [Bbox.from_extents(px - 7, py - 7, px + 7, py + 7) for px, py in disp]
    placed: list = []
    offsets = [
        (9, 7, "left", "bottom"),
        (9, -7, "left", "top"),
        (-9, 7, "right", "bottom"),
        (-9, -7, "right", "top"),
        (0, 11, "center", "bottom"),
        (0, -11, "center", "top"),
    ]
    offsets += [
        (sx * 12, sy * k, "left" if sx > 0 else "right", "bottom" if sy > 0 else "top")
        for k in (22, 34, 46, 58, 70)
        for sx in (1, -1)
        for sy in (1, -1)
    ]
    groups = sorted(_clusters(disp), key=lambda g: -max(xy_data[i][1] for i in g))
    for g in groups:
        label = _cluster_label(points, g)
        anchor = xy_data[g[0]]
        chosen = None
        for dx, dy, ha, va in offsets:
            far = abs(dy) > 14
            t = ax.annotate(
                label,
                anchor,
                xytext=(dx, dy),
                textcoords="offset points",
                ha=ha,
                va=va,
                fontsize=9,
                arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.6} if far else None,
            )
            bb = t.get_window_extent(renderer).expanded(1.04, 1.12)
            inside = (
                bb.x0 >= axes_box.x0
                and bb.x1 <= axes_box.x1
                and bb.y0 >= axes_box.y0
                and bb.y1 <= axes_box.y1
            )
            clash = any(bb.overlaps(o) for o in placed) or any(
                bb.overlaps(m) for j, m in enumerate(markers) if j not in g
            )
            if inside and not clash:
                chosen = bb
                break
            t.remove()
        if chosen is None:  # crowded beyond every candidate: the first spot, still inside the axes
            t = ax.annotate(
                label,
                anchor,
                xytext=offsets[0][:2],
                textcoords="offset points",
                ha="left",
                va="bottom",
                fontsize=9,
            )
            chosen = t.get_window_extent(renderer)
        placed.append(chosen)
    return placed


def throughput_vs_memory(
    points: Sequence[Point],
    path: str | os.PathLike,
    *,
    title: str,
    memory_label: str,
    throughput_label: str = "throughput (tokens/s)",
    footnote: str = "",
) -> list:
    """Write a scatter chart of throughput against peak device memory, one labelled point per plan.

    Points closer than a marker's width share one label.  Returns the labels' bounding boxes.
    """
    unit, scale = _byte_unit(max(p.x_bytes for p in points))
    series = list(dict.fromkeys(p.series for p in points))
    plans = list(dict.fromkeys(p.plan for p in points))
    colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(plans)}
    fig, ax = plt.subplots(figsize=(9, 5.6), dpi=130)
    for si, s in enumerate(series):
        for plan in plans:
            pts = [p for p in points if p.series == s and p.plan == plan]
            if pts:
                ax.scatter(
                    [p.x_bytes / scale for p in pts],
                    [p.y for p in pts],
                    s=70,
                    color=colours[plan],
                    marker=_MARKERS[si % len(_MARKERS)],
                    edgecolor="black",
                    linewidth=0.6,
                    zorder=3,
                    label=f"{plan} · {s}" if len(series) > 1 else plan,
                )
    xs = [p.x_bytes / scale for p in points]
    ys = [p.y for p in points]
    # Room around the points so labels stay inside the axes.
    xspan = (max(xs) - min(xs)) or max(xs) or 1.0
    yspan = (max(ys) - min(ys)) or max(ys) or 1.0
    ax.set_xlim(max(0.0, min(xs) - 0.25 * xspan), max(xs) + 0.35 * xspan)
    ax.set_ylim(max(0.0, min(ys) - 0.3 * yspan), max(ys) + 0.3 * yspan)
    ax.set_xlabel(f"{memory_label} — {unit} per device")
    ax.set_ylabel(throughput_label)
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(
        fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False
    )
    if footnote:
        fig.text(
            0.01, 0.005, footnote, fontsize=7.5, color="0.3", ha="left", va="bottom", wrap=True
        )
    fig.tight_layout(rect=(0, 0.05 if footnote else 0, 1, 1))
    boxes = _place_labels(fig, ax, points, list(zip(xs, ys, strict=False)))
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return boxes


def step_timeline(
    lanes: Mapping[str, Sequence[tuple[float, float]]],
    path: str | os.PathLike,
    *,
    title: str,
    summary: str = "",
    empty_note: str = "",
) -> None:
    """Write one step's lanes (start ms, duration ms) as horizontal bars; ``empty_note`` is written
    in empty lanes."""
    names = list(lanes)
    colours = {"compute": "#4C72B0", "device→host": "#DD8452", "host→device": "#55A868"}
    fig, ax = plt.subplots(figsize=(10, 1.1 + 0.7 * len(names)), dpi=130)
    end = max((s + d for iv in lanes.values() for s, d in iv), default=1.0)
    for row, name in enumerate(reversed(names)):
        bars = lanes[name]
        if bars:
            ax.broken_barh(
                list(bars), (row - 0.35, 0.7), facecolors=colours.get(name, "0.5"), edgecolor="none"
            )
        elif empty_note:
            ax.text(end * 0.01, row, empty_note, va="center", ha="left", fontsize=8, color="0.35")
    ax.set_yticks(range(len(names)), list(reversed(names)))
    ax.set_xlim(0, end * 1.02)
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.set_xlabel("time since the step started (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    if summary:
        fig.text(0.01, 0.005, summary, fontsize=8, color="0.25", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.1 if summary else 0, 1, 1))
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
