"""The training loop behind ``tierax train``.

:class:`Trainer` builds everything a run needs from a :class:`TrainConfig` —
mesh, data stream, optimizer with its schedule, state (fresh or restored), the
compiled step — checking for conflicts *before* anything is written, then
:meth:`Trainer.train` runs steps with checkpoints, a progress display and
``metrics.jsonl``.

The loop keeps the device busy: step ``k`` is dispatched before the metrics of
step ``k - 1`` are read (one step of lag), so where dispatch is asynchronous (GPUs)
the next batch is read from disk while a step runs.  Metrics are read without lag at checkpoint steps, so a
checkpoint is only written after its step's loss is known to be finite.  A NaN or
infinite loss (or gradient norm) stops the run with :class:`NonFiniteLoss` after
the checkpoints already started are complete; the diverged state is never saved.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from tierax.errors import TieraxError
from tierax.fileio import write_text_atomic
from tierax.models.flops import train_flops
from tierax.train import checkpoint as ckpt_lib
from tierax.train import data as data_lib
from tierax.mesh import BATCH_AXES
from tierax.train import sharding as sh
from tierax.train import step as step_lib
from tierax.train.config import Distributed, TrainConfig, config_to_yaml

METRICS = "metrics.jsonl"
CONFIG_SNAPSHOT = "train-config.yaml"
PLOT = "metrics.png"


class NonFiniteLoss(RuntimeError):
    """The loss or gradient norm of a step was NaN or infinite; the run stopped."""

    def __init__(self, step: int, loss: float, grad_norm: float, last_checkpoint: int | None, directory):
        self.step, self.loss, self.grad_norm, self.last_checkpoint = step, loss, grad_norm, last_checkpoint
        where = (f"the last good checkpoint is step {last_checkpoint} in {directory}"
                 if last_checkpoint is not None else "no checkpoint was written before it")
        super().__init__(f"step {step}: loss is {loss} (gradient norm {grad_norm}); training stopped, the "
                         f"diverged state was not saved; {where}")


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


@dataclass(frozen=True)
class TrainResult:
    """What one :meth:`Trainer.train` call did.

    Attributes:
      first_step, last_step: the steps trained by this call (``first_step >
        last_step`` when there was nothing left to train).
      losses: their losses, in order.
      resumed_from: the checkpoint step the trainer started from (None: fresh).
      last_checkpoint: the newest complete checkpoint when the call returned.
      compile_s: time to compile the step.
    """

    first_step: int
    last_step: int
    losses: tuple[float, ...]
    resumed_from: int | None
    last_checkpoint: int | None
    compile_s: float


# --- process set-up ---------------------------------------------------------------


def initialize_distributed(dist: Distributed | None) -> None:
    """Join a multi-process run with JAX's own runtime; call after ``xla_flags.configure``,
    before any JAX operation.  Single-process runs (``None``) do nothing."""
    if dist is None:
        return
    jax.distributed.initialize(coordinator_address=dist.coordinator, num_processes=dist.num_processes,
                               process_id=dist.process_id)


MEM_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
HOST_LIMIT = "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"


def runtime_env(cfg: TrainConfig, *, gpu: bool, num_processes: int = 1,
                environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """GPU runtime variables derived from the run: (variables to set, lines to print).

    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` = ``runtime.device_budget_gb`` over the
    target's device memory (JAX preallocates 75 % by default, so a plan that fits
    90 % needs it); ``XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB`` = ``runtime.host_budget_gb``,
    else the plan's offloaded activation bytes on this process's devices plus 25 %.
    A variable already in the environment is kept.  On CPU neither applies.
    """
    if not gpu:
        return {}, [f"runtime env: {MEM_FRACTION} and {HOST_LIMIT} apply to GPUs only; nothing set on CPU"]
    from tierax import hardware
    from tierax import inventory as inv

    env = os.environ if environ is None else environ
    rt, wanted, lines = cfg.runtime, {}, []
    if rt.device_budget_gb is not None:
        hbm = hardware.get_target(rt.target).device_memory_bytes
        frac = min(0.95, rt.device_budget_gb * 1e9 / hbm)
        wanted[MEM_FRACTION] = (f"{frac:.2f}", f"device budget {rt.device_budget_gb:g} GB of {hbm / 1e9:.0f} GB ({rt.target})")
    else:
        lines.append(f"runtime env: {MEM_FRACTION} not derived (no runtime.device_budget_gb); JAX preallocates 75 %")
    local_devices = max(1, cfg.mesh.size // num_processes)
    if rt.host_budget_gb is not None:
        wanted[HOST_LIMIT] = (f"{math.ceil(rt.host_budget_gb)}", "runtime.host_budget_gb")
    else:
        offload = inv.bytes_by_placement(inv.model_inventory(cfg.model, cfg.microbatch, cfg.seq, cfg.mesh.to_dict()),
                                         cfg.plan, cfg.model)["offload"]
        if offload:
            gb = max(1, math.ceil(offload * local_devices * 1.25 / 1e9))
            wanted[HOST_LIMIT] = (str(gb), f"plan offloads {offload / 1e9:.2f} GB/device × {local_devices} devices + 25 %")
        else:
            lines.append(f"runtime env: {HOST_LIMIT} not set (plan {cfg.plan.name} offloads nothing)")
    out = {}
    for var, (value, why) in wanted.items():
        if var in env:
            lines.append(f"runtime env: kept {var}={env[var]} from the environment (derived: {value}, {why})")
        else:
            out[var] = value
            lines.append(f"runtime env: set {var}={value} ({why})")
    return out, lines


def verify_before_training(cfg: TrainConfig) -> str:
    """``train --verify``: the plan's loss and gradients against ``save-all`` on one local
    device (``tierax.measure.verify``); returns the line to print.

    Raises:
      TieraxError: the plan changes the gradients beyond the dtype's tolerance.
    """
    try:  # imported only when asked: verification is its own part of tierax
        from tierax.measure.verify import verify_plan
    except ImportError as e:
        raise TieraxError(f"--verify needs tierax.measure.verify, which this installation lacks ({e})") from None
    res = verify_plan(cfg.model, cfg.plan, microbatch=cfg.microbatch, seq=cfg.seq, seed=cfg.seed)
    if not res.passed:
        raise TieraxError(
            f"--verify: plan {cfg.plan.name!r} changes the gradients of {cfg.model.name} (max relative error "
            f"{res.max_rel_err:.2e}, tolerance {res.tolerance:.0e}; worst leaves: {res.worst_leaves}); not training"
        )
    return (f"verify: plan {cfg.plan.name} vs save-all: max relative gradient error {res.max_rel_err:.2e} "
            f"≤ {res.tolerance:.0e}, passed")


# --- metrics ----------------------------------------------------------------------


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """The records of ``RUN_DIR/metrics.jsonl`` (a line cut short by a crash is skipped).

    Raises:
      TieraxError: no metrics file.
    """
    path = pathlib.Path(run_dir) / METRICS
    if not path.is_file():
        raise TieraxError(f"{str(run_dir)!r} has no {METRICS}; give the log.dir of a `tierax train` run")
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


class _MetricsLog:
    """Appends one JSON line per step; opened by process 0 only."""

    def __init__(self, log_dir: pathlib.Path, keep_through: int):
        path = log_dir / METRICS
        kept = [r for r in read_metrics(log_dir) if r.get("step", 0) <= keep_through] if path.is_file() else []
        # Drop records of steps after the restored checkpoint: they are about to be trained again.
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
        self._file = open(path, "a", buffering=1)  # line-buffered: a crash loses at most one line

    def write(self, rec: StepRecord) -> None:
        self._file.write(json.dumps(asdict(rec)) + "\n")

    def close(self) -> None:
        self._file.close()


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
            TextColumn("step"), MofNCompleteColumn(), BarColumn(),
            TextColumn("loss {task.fields[loss]}  {task.fields[tps]} tok/s  {task.fields[tflops]} TFLOP/s/dev  "
                       "ETA {task.fields[eta]}"),
            # Redrawn from the loop, at most every REFRESH_S, instead of by rich's refresh thread,
            # which competes with the step for the CPU and the GIL.
            console=console, transient=True, disable=not console.is_terminal, auto_refresh=False,
        )
        self.task = None
        self._drawn = 0.0

    REFRESH_S = 0.25

    def start(self, first, last, title):
        self.console.print(title)
        self.progress.start()
        self.task = self.progress.add_task("train", total=last, completed=first - 1, loss="-", tps="-", tflops="-",
                                           eta="-")

    def step(self, rec, eta_s):
        eta = _fmt_eta(eta_s)
        self.progress.update(self.task, completed=rec.step, loss=f"{rec.loss:.4f}", tps=f"{rec.tokens_per_s:,.0f}",
                             tflops=f"{rec.tflops_per_device:.4f}", eta=eta)
        if time.monotonic() - self._drawn >= self.REFRESH_S:
            self.progress.refresh()
            self._drawn = time.monotonic()
        if rec.step % self.every == 0:
            self.progress.console.print(
                f"step {rec.step:6d}  loss {rec.loss:8.4f}  grad norm {rec.grad_norm:8.3f}  lr {rec.lr:.2e}  "
                f"{rec.tokens_per_s:12,.0f} tok/s  {rec.tflops_per_device:8.4f} TFLOP/s/device  ETA {eta}"
            )

    def note(self, text):
        self.progress.console.print(text)

    def stop(self):
        if self.task is not None:  # a later train() call starts its own bar
            self.progress.remove_task(self.task)
            self.task = None
        self.progress.stop()


# --- the trainer ------------------------------------------------------------------


def lr_schedule(cfg: TrainConfig) -> optax.Schedule:
    """Linear warm-up from 0 to ``optimizer.lr`` at step ``warmup_steps``, then cosine decay to
    ``lr × end_lr_ratio`` at step ``decay_steps`` (``optax.warmup_cosine_decay_schedule``).

    Optax calls a schedule with the update count (0 for step 1); it is shifted by one so
    that step ``k`` trains at the schedule's value at ``k``: the first step's rate is
    ``lr / warmup_steps``, not 0.
    """
    o = cfg.optimizer
    base = optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=o.lr, warmup_steps=o.warmup_steps,
                                              decay_steps=cfg.decay_steps, end_value=o.lr * o.end_lr_ratio)
    return lambda count: base(count + 1)


def _scalar(x) -> float:
    # Replicated over the mesh: this process's first shard holds the value, even when
    # the array spans processes (float() would refuse a non-addressable array).
    return float(np.asarray(x.addressable_data(0)))


class Trainer:
    """A training run on the local (or, with ``jax.distributed``, global) devices.

    Args:
      cfg: the run.
      resume: continue from the newest complete checkpoint in the checkpoint
        directory (none there: start fresh).  Without it, a directory that already
        holds checkpoints or metrics is an error.
      devices: the devices of the mesh (default: all); tests use a subset.
      reporter: progress display (process 0 only; others stay silent).

    Raises:
      TieraxError: the mesh does not match the devices, bad data, or a checkpoint
        or log directory that belongs to another run.  Nothing is written before
        these checks pass.
    """

    def __init__(self, cfg: TrainConfig, *, resume: bool = False, devices=None, reporter: Reporter | None = None):
        self.cfg = cfg
        self.is_main = jax.process_index() == 0
        self.reporter = reporter if (reporter is not None and self.is_main) else Reporter()
        self.mesh = cfg.mesh.make(devices)
        shape = data_lib.BatchShape(cfg.grad_accum, cfg.global_batch, cfg.seq)
        self.stream = data_lib.open_stream(cfg.data.source, cfg.data.path, shape, seed=cfg.seed,
                                           vocab_size=cfg.model.vocab_size)
        self.identity = cfg.identity()
        self.identity["data"].update(self.stream.identity())

        # --- checks, before anything is written --------------------------------
        self.ckpt_dir = cfg.checkpoint_dir
        self.log_dir = pathlib.Path(cfg.log.dir)
        done = ckpt_lib.complete_steps(self.ckpt_dir) if self.ckpt_dir else []
        broken = ckpt_lib.incomplete_steps(self.ckpt_dir) if self.ckpt_dir else []
        if broken:
            raise TieraxError(
                f"checkpoint.dir {self.ckpt_dir} has step directories that are not complete checkpoints "
                f"({', '.join(str(self.ckpt_dir / str(b)) for b in broken)}: no commit record); move them away "
                "before training into this directory"
            )
        self.resumed_from = None
        if done and not resume:
            raise TieraxError(
                f"checkpoint.dir {self.ckpt_dir} already holds checkpoints (steps {', '.join(map(str, done))}); "
                "pass --resume to continue that run, or use another checkpoint.dir / log.dir"
            )
        if done:
            meta = ckpt_lib.read_meta(self.ckpt_dir, done[-1])
            ckpt_lib.check_compatible(meta, self.identity, f"{self.ckpt_dir}/{done[-1]}")
            self.resumed_from = done[-1]
        if not resume and (self.log_dir / METRICS).exists():
            raise TieraxError(
                f"log.dir {self.log_dir} already holds a run ({METRICS}); pass --resume to continue it, "
                "or use another log.dir"
            )
        if jax.process_count() > 1:  # nobody writes until every process has checked
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("tierax-train-checks")

        # --- state --------------------------------------------------------------
        self.schedule = lr_schedule(cfg)
        o = cfg.optimizer
        optimizer = step_lib.make_optimizer(self.schedule, o.weight_decay, b1=o.b1, b2=o.b2, eps=o.eps,
                                            grad_clip=o.grad_clip)
        self._lrs = np.asarray(jax.jit(jax.vmap(self.schedule))(jnp.arange(cfg.steps)))  # [k - 1]: step k's rate
        graphdef, self.state = step_lib.init_state(cfg.model, optimizer, seed=cfg.seed, mesh=self.mesh)
        self.checkpointer = None
        if self.ckpt_dir:
            self.checkpointer = ckpt_lib.Checkpointer(self.ckpt_dir, keep=cfg.checkpoint.keep,
                                                      asynchronous=cfg.checkpoint.async_save)
        if self.resumed_from is not None:
            self.state, _ = self.checkpointer.restore(self.resumed_from, self.state)
        self.step = int(_scalar(self.state.step))

        rows_axis = 0 if cfg.grad_accum == 1 else 1
        self._global_shape = shape.global_shape if cfg.grad_accum > 1 else shape.global_shape[1:]
        spec = P(BATCH_AXES) if cfg.grad_accum == 1 else P(None, BATCH_AXES)
        self._batch_sharding = NamedSharding(self.mesh, spec)
        self._rows = data_lib.local_rows(self._batch_sharding, self._global_shape, axis=rows_axis)

        self._step_fn = step_lib.make_train_step(graphdef, cfg.model, cfg.plan, optimizer,
                                                 step_lib.shardings_of(self.state), grad_accum=cfg.grad_accum)
        # Compiled ahead to time it; the loop then calls the jitted function, which reuses this
        # executable through JAX's caches and dispatches through its C++ fast path (calling the
        # Compiled object flattens the state in Python every step: measured 1–4 % of a demo CPU step).
        t0 = time.perf_counter()
        batch_spec = jax.ShapeDtypeStruct(self._global_shape, jnp.int32, sharding=self._batch_sharding)
        self._step_fn.lower(self.state, batch_spec).compile()
        self.compile_s = time.perf_counter() - t0
        self._flops = train_flops(cfg.model, cfg.batch_per_step, cfg.seq)
        self._tokens = cfg.batch_per_step * cfg.seq

        # --- outputs (process 0) ------------------------------------------------
        self._log = None
        if self.is_main:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.log_dir / CONFIG_SNAPSHOT, config_to_yaml(cfg))
            self._log = _MetricsLog(self.log_dir, keep_through=self.step)
        self._step_times: list[float] = []

    # --- pieces of a step -----------------------------------------------------------
    def batch(self, step: int) -> jax.Array:
        """The global batch of ``step`` (this process supplies its own rows)."""
        local = self.stream.rows(step, *self._rows)
        if self.cfg.grad_accum == 1:
            local = local[0]
        return jax.make_array_from_process_local_data(self._batch_sharding, local, self._global_shape)

    def _poison(self, state):
        # TEST-ONLY (debug.nan_at_step): NaN parameters make this step's loss NaN for real.
        def nan(params):
            return jax.tree.map(lambda x: x * jnp.nan if jnp.issubdtype(x.dtype, jnp.floating) else x, params)

        return state._replace(params=jax.jit(nan, out_shardings=step_lib.shardings_of(state.params))(state.params))

    def _is_checkpoint_step(self, k: int) -> bool:
        return self.checkpointer is not None and (k % self.cfg.checkpoint.every == 0 or k == self.cfg.steps)

    def _latest_checkpoint(self) -> int | None:
        """The newest complete checkpoint, once every started save has finished."""
        if self.checkpointer is None:
            return None
        self.checkpointer.wait()
        done = ckpt_lib.complete_steps(self.ckpt_dir)
        return done[-1] if done else None

    def _complete(self, k: int, metrics) -> None:
        loss, gnorm = _scalar(metrics["loss"]), _scalar(metrics["grad_norm"])
        now = time.perf_counter()
        dt, self._t_last = now - self._t_last, now
        if not (math.isfinite(loss) and math.isfinite(gnorm)):
            # _latest_checkpoint waits: the last good checkpoint is complete on disk before we stop.
            raise NonFiniteLoss(k, loss, gnorm, self._latest_checkpoint(), self.ckpt_dir)
        self._losses.append(loss)
        self._step_times.append(dt)
        rec = StepRecord(step=k, loss=loss, grad_norm=gnorm, lr=float(self._lrs[k - 1]),
                         step_time_s=dt, tokens_per_s=self._tokens / dt,
                         tflops_per_device=self._flops / dt / self.mesh.size / 1e12, time=time.time())
        if self._log is not None:
            self._log.write(rec)
        recent = self._step_times[-20:]
        self.reporter.step(rec, eta_s=(self.cfg.steps - k) * sum(recent) / len(recent))

    def _save(self, k: int) -> None:
        meta = {"config": self.cfg.to_dict(), "identity": self.identity,
                "data": {"source": self.cfg.data.source, "seed": self.cfg.seed, "next_step": k + 1}}
        t0 = time.perf_counter()
        self.checkpointer.save(k, self.state, meta)
        self.reporter.note(f"checkpoint step {k} → {self.ckpt_dir} ({time.perf_counter() - t0:.2f} s blocking, "
                           f"{'written in the background' if self.cfg.checkpoint.async_save else 'written'})")

    # --- the loop -------------------------------------------------------------------
    def train(self, until: int | None = None) -> TrainResult:
        """Train from the current step to ``until`` (default: ``cfg.steps``).

        Raises:
          NonFiniteLoss: a step's loss or gradient norm was NaN or infinite.
        """
        cfg = self.cfg
        until = cfg.steps if until is None else min(until, cfg.steps)
        first = self.step + 1
        self._losses: list[float] = []
        self.reporter.start(first, cfg.steps, self._title(first))
        self._t_last = time.perf_counter()
        pending = None
        try:
            for k in range(first, until + 1):
                if cfg.debug.nan_at_step == k:
                    self.state = self._poison(self.state)
                self.state, metrics = self._step_fn(self.state, self.batch(k))
                if pending is not None:
                    self._complete(*pending)
                pending = (k, metrics)
                if cfg.debug.step_delay_s:
                    time.sleep(cfg.debug.step_delay_s)  # TEST-ONLY
                if self._is_checkpoint_step(k):
                    self._complete(*pending)  # its loss must be finite before it is saved
                    pending = None
                    self._save(k)
                    self._t_last = time.perf_counter()
                self.step = k
            if pending is not None:
                self._complete(*pending)
        finally:
            self.reporter.stop()
        return TrainResult(first, until, tuple(self._losses), self.resumed_from, self._latest_checkpoint(),
                           self.compile_s)

    def _title(self, first: int) -> str:
        cfg = self.cfg
        start = f"resuming from checkpoint step {self.resumed_from}" if self.resumed_from is not None else "fresh start"
        return (f"train {cfg.model.name} · plan {cfg.plan.name} · mesh {cfg.mesh} "
                f"({jax.device_count()} {jax.devices()[0].platform} device(s), {jax.process_count()} process(es)) · "
                f"{cfg.microbatch}/device × {cfg.grad_accum} accum = {cfg.batch_per_step} seq × {cfg.seq} tokens · "
                f"steps {first}–{cfg.steps} ({start}) · compiled in {self.compile_s:.1f} s")

    def close(self) -> None:
        """Finish pending checkpoint writes, close the log, draw the plot (process 0)."""
        if self.checkpointer is not None:
            self.checkpointer.wait()
            self.checkpointer.close()
        if self._log is not None:
            self._log.close()
            if self.cfg.log.plot and read_metrics(self.log_dir):
                from tierax.train.plots import plot_metrics

                plot_metrics(self.log_dir)

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
