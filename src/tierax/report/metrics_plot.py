"""``tierax plot-metrics``: loss and throughput curves of a run, as a PNG.

Each curve is drawn from the records that carry its value; a record without one (an older run's,
or a step whose throughput was not measured) is left out of that curve and reported.
The PNG carries a ``Software`` text chunk naming tierax, so a later run may replace it
(:func:`is_metrics_png`) and nothing else.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Callable

import yaml

from tierax.errors import TieraxError
from tierax.fileio import is_tierax_png, new_file_mode, png_metadata
from tierax.train.run_dir import CONFIG_SNAPSHOT, PLOT, read_metrics


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _title(run_dir: pathlib.Path) -> str:
    try:
        cfg = yaml.safe_load((run_dir / CONFIG_SNAPSHOT).read_text())
        mesh = cfg["mesh"]
        return (
            f"{cfg['model']['name']} · plan {cfg['plan']['plan']} · {cfg['microbatch']}/device × "
            f"mesh {','.join(f'{k}={v}' for k, v in mesh.items())} · seq {cfg['seq']}"
        )
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return str(run_dir)


SERIES = ("loss", "tokens_per_s", "tflops_per_device")
VAL_COLOR = "tab:red"  # the validation loss (records with val_loss), beside the training loss
_WHAT = "plot-metrics"


def is_metrics_png(path: pathlib.Path) -> bool:
    """Whether ``path`` is a PNG this module wrote (its ``Software`` text chunk)."""
    return is_tierax_png(path, _WHAT)


def check_png_name(out: str | os.PathLike, option: str = "--out") -> None:
    """The plot is a PNG: a name ending in anything but ``.png`` is refused.

    Raises:
      TieraxError: ``out`` does not end in ``.png``.
    """
    if pathlib.Path(out).suffix.lower() != ".png":
        raise TieraxError(
            f"{option} {str(out)!r}: the metrics plot is written as PNG only; give a name "
            "ending in .png"
        )


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _curve(records: list[dict], key: str) -> tuple[list, list[float]]:
    kept = [r for r in records if _number(r.get(key))]
    return [r["step"] for r in kept], [float(r[key]) for r in kept]


def plot_metrics(
    run_dir: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    note: Callable[[str], None] | None = None,
) -> pathlib.Path:
    """Draw loss (raw and smoothed; the validation loss where records have one) and throughput
    (tokens/s, TFLOP/s/device) against step.

    Args:
      run_dir: a ``log.dir`` of ``tierax train`` (holds ``metrics.jsonl``).
      out: the PNG to write (default ``RUN_DIR/metrics.png``); written atomically.
      note: called with one line per curve some records lack (those records are not drawn in it)
        and per line of the metrics file that is not a JSON record (skipped).

    Raises:
      TieraxError: no metrics in ``run_dir``, or no record with a step and any of
        :data:`SERIES`.
    """
    run = pathlib.Path(run_dir)
    if out is not None:
        check_png_name(out)
    records = [
        r for r in read_metrics(run, note) if isinstance(r, dict) and _number(r.get("step"))
    ]
    records.sort(key=lambda r: r["step"])
    if not records:
        raise TieraxError(f"{run} has no step records yet; nothing to plot")
    curves = {key: _curve(records, key) for key in SERIES}
    if not any(values for _, values in curves.values()):
        raise TieraxError(
            f"{run}/metrics.jsonl: no record has any of {', '.join(SERIES)}; nothing to plot — "
            "give the log.dir of a `tierax train` run"
        )
    for key, (_, values) in curves.items():
        if len(values) < len(records):
            (note or (lambda _: None))(
                f"{len(records) - len(values)} of {len(records)} step records have no {key!r}; "
                + ("its curve is not drawn" if not values else "they are left out of its curve")
            )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    window = max(1, len(records) // 20)
    fig, (ax_loss, ax_tput) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, height_ratios=(3, 2))
    steps, loss = curves["loss"]
    if loss:
        ax_loss.plot(steps, loss, color="tab:blue", alpha=0.35, lw=1, label="loss")
    if loss and window > 1:
        ax_loss.plot(
            steps, _smooth(loss, window), color="tab:blue", lw=2, label=f"loss ({window}-step mean)"
        )
    val_steps, val_loss = _curve(records, "val_loss")  # at validation steps only
    if val_loss:
        ax_loss.plot(
            val_steps, val_loss, color=VAL_COLOR, marker="o", ms=4, lw=1.5, label="validation loss"
        )
    ax_loss.set_ylabel("loss (nats / token)")
    ax_loss.grid(alpha=0.3)
    if loss or val_loss:
        ax_loss.legend(loc="upper right")
    ax_loss.set_title(_title(run), fontsize=10)

    # The first steps after a compile or a checkpoint save are slow; show them, but let the
    # smoothed line carry the steady rate.
    steps, tps = curves["tokens_per_s"]
    if tps:
        ax_tput.plot(steps, tps, color="tab:green", alpha=0.35, lw=1)
        ax_tput.plot(
            steps, _smooth(tps, max(window, 3)), color="tab:green", lw=2, label="tokens/s"
        )
    ax_tput.set_ylabel("tokens / s", color="tab:green")
    ax_tput.tick_params(axis="y", labelcolor="tab:green")
    ax_tput.set_xlabel("step")
    ax_tput.grid(alpha=0.3)
    ax_flops = ax_tput.twinx()
    steps, tflops = curves["tflops_per_device"]
    if tflops:
        ax_flops.plot(
            steps,
            _smooth(tflops, max(window, 3)),
            color="tab:orange",
            lw=1.5,
            ls="--",
            label="TFLOP/s/device",
        )
    ax_flops.set_ylabel("TFLOP/s per device (MaxText convention)", color="tab:orange")
    ax_flops.tick_params(axis="y", labelcolor="tab:orange")
    ax_tput.set_ylim(bottom=0)
    ax_flops.set_ylim(bottom=0)
    lines = ax_tput.get_lines()[1:] + ax_flops.get_lines()
    if lines:
        ax_tput.legend(lines, [ln.get_label() for ln in lines], loc="lower right")
    fig.tight_layout()

    target = pathlib.Path(out) if out is not None else run / PLOT
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110, format="png", metadata=png_metadata(_WHAT))
        os.chmod(tmp, new_file_mode())  # mkstemp's 0600 would outlive the rename
        os.replace(tmp, target)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return target
