"""A training run's log directory: the metrics file, the config snapshot, step records.

``RUN_DIR/metrics.jsonl`` has one JSON line per step (:class:`StepRecord`);
``RUN_DIR/train-config.yaml`` is the resolved config, loadable by ``tierax train``.
Plots of a run are drawn by :mod:`tierax.report.metrics_plot`.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable
from dataclasses import asdict, dataclass

from tierax.errors import TieraxError
from tierax.fileio import write_text_atomic

METRICS = "metrics.jsonl"
CONFIG_SNAPSHOT = "train-config.yaml"
PLOT = "metrics.png"


@dataclass(frozen=True)
class StepRecord:
    """One line of ``metrics.jsonl``."""

    step: int
    loss: float
    grad_norm: float
    lr: float
    step_time_s: float
    tokens_per_s: float
    tflops_per_device: float
    time: float  # unix seconds when the step's result was read
    tokens_seen: int = 0  # input tokens of every step up to this one
    epoch: float | None = None  # epochs of the data completed (a mixture: its most repeated set)
    val_loss: float | None = None  # the validation loss after this step, where one was computed


def read_metrics(
    run_dir: str | os.PathLike, note: Callable[[str], None] | None = None
) -> list[dict]:
    """The records of ``RUN_DIR/metrics.jsonl``; a line that is not JSON (cut short by a crash, or
    edited) is skipped, and ``note`` is told which.

    Raises:
      TieraxError: no metrics file.
    """
    path = pathlib.Path(run_dir) / METRICS
    if not path.is_file():
        raise TieraxError(
            f"{str(run_dir)!r} has no {METRICS}; give the log.dir of a `tierax train` run"
        )
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            out.append(json.loads(line))
        except ValueError as e:
            if note is not None and line.strip():
                note(f"{path}: line {n} is not a JSON record ({e.msg}); skipped")
    return out


class MetricsLog:
    """Appends one JSON line per step; opened by process 0 only."""

    def __init__(self, log_dir: pathlib.Path, keep_through: int):
        path = log_dir / METRICS
        kept = (
            [r for r in read_metrics(log_dir) if r.get("step", 0) <= keep_through]
            if path.is_file()
            else []
        )
        # Drop records of steps after the restored checkpoint: they are about to be trained again.
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
        self._file = open(path, "a", buffering=1)  # line-buffered: a crash loses at most one line

    def write(self, rec: StepRecord) -> None:
        self._file.write(json.dumps(asdict(rec)) + "\n")

    def close(self) -> None:
        self._file.close()
