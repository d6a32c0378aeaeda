"""``tierax plot-metrics``: loss and throughput curves of a run, as a PNG."""

from __future__ import annotations

import os
import pathlib
import tempfile

import yaml

from tierax.errors import TieraxError
from tierax.fileio import new_file_mode
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


def plot_metrics(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> pathlib.Path:
    """Draw loss (raw and smoothed) and throughput (tokens/s, TFLOP/s/device) against step.

    Args:
      run_dir: a ``log.dir`` of ``tierax train`` (holds ``metrics.jsonl``).
      out: the image to write (default ``RUN_DIR/metrics.png``), in the format its suffix names
        (png, jpg, svg, pdf, ...: what matplotlib writes); written atomically.

    Raises:
      TieraxError: no metrics in ``run_dir``; an ``out`` suffix that names no image format.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = pathlib.Path(out) if out is not None else pathlib.Path(run_dir) / PLOT
    fmt = image_format(target)

    run = pathlib.Path(run_dir)
    records = sorted(read_metrics(run), key=lambda r: r["step"])
    if not records:
        raise TieraxError(f"{run} has no step records yet; nothing to plot")
    steps = [r["step"] for r in records]
    loss = [r["loss"] for r in records]
    window = max(1, len(records) // 20)

    fig, (ax_loss, ax_tput) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, height_ratios=(3, 2))
    ax_loss.plot(steps, loss, color="tab:blue", alpha=0.35, lw=1, label="loss")
    if window > 1:
        ax_loss.plot(
            steps, _smooth(loss, window), color="tab:blue", lw=2, label=f"loss ({window}-step mean)"
        )
    ax_loss.set_ylabel("loss (nats / token)")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(loc="upper right")
    ax_loss.set_title(_title(run), fontsize=10)

    # The first steps after a compile or a checkpoint save are slow; show them, but let the
    # smoothed line carry the steady rate.
    tps = [r["tokens_per_s"] for r in records]
    ax_tput.plot(steps, tps, color="tab:green", alpha=0.35, lw=1)
    ax_tput.plot(steps, _smooth(tps, max(window, 3)), color="tab:green", lw=2, label="tokens/s")
    ax_tput.set_ylabel("tokens / s", color="tab:green")
    ax_tput.tick_params(axis="y", labelcolor="tab:green")
    ax_tput.set_xlabel("step")
    ax_tput.grid(alpha=0.3)
    ax_flops = ax_tput.twinx()
    ax_flops.plot(
        steps,
        _smooth([r["tflops_per_device"] for r in records], max(window, 3)),
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
    ax_tput.legend(lines, [ln.get_label() for ln in lines], loc="lower right")
    fig.tight_layout()

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=f".{fmt}")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110, format=fmt)
        os.chmod(tmp, new_file_mode())  # mkstemp's 0600 would outlive the rename
        os.replace(tmp, target)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return target


def image_format(path: pathlib.Path) -> str:
    """The image format ``path``'s suffix names, as matplotlib writes it.

    Raises:
      TieraxError: no suffix, or one matplotlib writes no image for (e.g. ``.txt``).
    """
    from matplotlib.backend_bases import FigureCanvasBase

    supported = FigureCanvasBase.get_supported_filetypes()
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in supported:
        raise TieraxError(
            f"--out {str(path)!r}: {'no suffix' if not fmt else repr('.' + fmt)} names no image "
            f"format; end it in one of: {', '.join('.' + k for k in sorted(supported))}"
        )
    return fmt
