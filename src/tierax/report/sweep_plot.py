"""The planner's frontier as a picture: predicted TFLOP/s/device against a swept quantity."""

from __future__ import annotations

import io
import os
import pathlib
from collections.abc import Sequence

from tierax.fileio import is_tierax_png, png_metadata, write_text_atomic

SWEEP_PNG = "plan --sweep"  # the PNG's Software text: tierax plan --sweep


def is_sweep_png(path: pathlib.Path) -> bool:
    """Whether ``path`` is a frontier PNG ``tierax plan --sweep`` wrote."""
    return is_tierax_png(path, SWEEP_PNG)


UNITS = {
    "budget": "device budget (GiB)",
    "microbatch": "microbatch (sequences per device)",
    "host_link": "host link (GB/s per direction)",
    "d2h": "device→host (GB/s)",
    "h2d": "host→device (GB/s)",
    "hbm_size": "device memory (GB)",
    "hbm_bw": "HBM bandwidth (TB/s)",
    "matmul": "matmul rate (TFLOP/s)",
    "interconnect": "interconnect (GB/s per direction)",
    "host_memory": "host memory per device (GB)",
}


def plot_sweep(
    points: Sequence[dict], key: str, out: str | os.PathLike, *, title: str, references=()
) -> pathlib.Path:
    """Draw ``points`` (:class:`tierax.solving.whatif.SweepPoint` JSON) to ``out`` (PNG, written
    atomically).

    The planner's curve is annotated where its plan changed and its prediction moved (plan changes
    between equally fast plans are ties, kept in the record, not drawn); each reference preset is a
    dashed curve.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=110)
    xs = [p["value"] for p in points]
    ax.plot(
        xs,
        [p["tflops_per_device"] for p in points],
        "o-",
        color="tab:blue",
        label="planner's plan",
        zorder=3,
    )
    for name, style, marker in zip(references, ("--", ":"), ("x", "+"), strict=False):
        # above the planner's curve, with markers: a reference equal to the planner's plan (a
        # budget that fits save-all) stays visible
        ys = [p["reference"].get(name) for p in points]
        nowhere = all(y is None for y in ys)
        ax.plot(
            xs,
            ys,
            style,
            marker=marker,
            markersize=10,
            markeredgewidth=1.5,
            color="dimgray",
            label=f"{name} (reference{': fits at no point' if nowhere else ''})",
            zorder=4,
        )
    prev, side = None, 1
    for p in points:
        if not p["fits"]:
            ax.annotate(
                "no plan fits",
                (p["value"], 0),
                fontsize=7,
                color="tab:red",
                rotation=90,
                va="bottom",
            )
            continue
        # A change that leaves the prediction equal is a tie between equally fast plans, not a
        # decision.
        moved = prev is not None and abs(p["tflops_per_device"] - prev) > 1e-3 * prev
        prev = p["tflops_per_device"]
        if p["changed"] and moved:
            shown = p["changed"][:3]
            text = "\n".join(shown) + (
                f"\n+{len(p['changed']) - 3} more" if len(p["changed"]) > 3 else ""
            )
            ax.annotate(
                text,
                (p["value"], p["tflops_per_device"]),
                textcoords="offset points",
                xytext=(4, -8 if side > 0 else 10),
                fontsize=6.5,
                va="top" if side > 0 else "bottom",
                color="tab:blue",
                annotation_clip=False,
            )
            side = -side
    ax.set_xlabel(UNITS.get(key, key))
    ax.set_ylabel("predicted TFLOP/s per device")
    top = max(
        [p["tflops_per_device"] or 0 for p in points]
        + [v or 0 for p in points for v in p["reference"].values()]
        + [1.0]
    )
    ax.set_ylim(0, top * 1.25)  # room for the annotations
    ax.margins(x=0.12)  # room for the last point's annotation
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=9)
    fig.text(
        0.01,
        0.01,
        "cost-model predictions (tierax.costmodel), not measurements",
        fontsize=7,
        color="gray",
    )
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", metadata=png_metadata(SWEEP_PNG), bbox_inches="tight")
    finally:
        plt.close(fig)
    return write_text_atomic(out, buf.getvalue())
