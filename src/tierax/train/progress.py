"""Progress display of a training run: silent (``--json``, benchmarks) or a live rich bar."""

from __future__ import annotations

import time

from tierax.train.run_dir import StepRecord


class Reporter:
    """Progress display; this base class shows nothing (``--json`` runs, benchmarks)."""

    def start(self, first: int, last: int, title: str) -> None: ...

    def step(self, rec: StepRecord, eta_s: float) -> None: ...

    def note(self, text: str) -> None: ...

    def stop(self) -> None: ...


def _fmt_eta(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class RichReporter(Reporter):
    """A live rich progress bar (on a terminal) plus a printed line every ``every`` steps."""

    def __init__(self, console, every: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.console, self.every = console, every
        self.progress = Progress(
            TextColumn("step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn(
                "loss {task.fields[loss]}  {task.fields[tps]} tok/s  {task.fields[tflops]} "
                "TFLOP/s/dev  ETA {task.fields[eta]}"
            ),
            # Redrawn from the loop, at most every REFRESH_S, instead of by rich's refresh thread,
            # which competes with the step for the CPU and the GIL.
            console=console,
            transient=True,
            disable=not console.is_terminal,
            auto_refresh=False,
        )
        self.task = None
        self._drawn = 0.0

    REFRESH_S = 0.25

    def start(self, first, last, title):
        self.console.print(title)
        self.progress.start()
        self.task = self.progress.add_task(
            "train", total=last, completed=first - 1, loss="-", tps="-", tflops="-", eta="-"
        )

    def step(self, rec, eta_s):
        eta = _fmt_eta(eta_s)
        self.progress.update(
            self.task,
            completed=rec.step,
            loss=f"{rec.loss:.4f}",
            tps=f"{rec.tokens_per_s:,.0f}",
            tflops=f"{rec.tflops_per_device:.4f}",
            eta=eta,
        )
        if time.monotonic() - self._drawn >= self.REFRESH_S:
            self.progress.refresh()
            self._drawn = time.monotonic()
        if rec.step % self.every == 0:
            self.progress.console.print(
                f"step {rec.step:6d}  loss {rec.loss:8.4f}  grad norm {rec.grad_norm:8.3f}  lr "
                f"{rec.lr:.2e}  {rec.tokens_per_s:12,.0f} tok/s  {rec.tflops_per_device:8.4f} "
                f"TFLOP/s/device  {rec.tokens_seen:,} tokens"
                + (f" (epoch {rec.epoch:.3f})" if rec.epoch is not None else "")
                + f"  ETA {eta}"
            )

    def note(self, text):
        self.progress.console.print(text)

    def stop(self):
        if self.task is not None:  # a later train() call starts its own bar
            self.progress.remove_task(self.task)
            self.task = None
        self.progress.stop()
