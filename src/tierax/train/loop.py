"""The training loop behind ``tierax train``.

:class:`Trainer` builds everything a run needs from a :class:`TrainConfig` —
mesh, data stream, optimizer with its schedule, state (fresh or restored), the
compiled step — checking for conflicts *before* anything is written, then
:meth:`Trainer.train` runs steps with checkpoints, a progress display and
``metrics.jsonl``.

The loop keeps the device busy: step ``k`` is dispatched before the metrics of
step ``k - 1`` are read (one step of lag), so where dispatch is asynchronous (GPUs)
the next batch is read from disk while a step runs.  Metrics are read without lag at checkpoint
steps, so a checkpoint is only written after its step's loss is known to be finite.  A NaN or
infinite loss (or gradient norm) stops the run with :class:`NonFiniteLoss` after the checkpoints
already started are complete; the diverged state is never saved.
"""

from __future__ import annotations

import contextlib
import math
import pathlib
import signal
import threading
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tierax.errors import TieraxError
from tierax.fileio import write_text_atomic
from tierax.mesh import BATCH_AXES
from tierax.models.flops import train_flops
from tierax.train import checkpoint as ckpt_lib
from tierax.train import data as data_lib
from tierax.train import step as step_lib
from tierax.train.config import TrainConfig, config_to_yaml
from tierax.train.progress import Reporter
from tierax.train.run_dir import CONFIG_SNAPSHOT, METRICS, MetricsLog, StepRecord
from tierax.train.schedule import lr_schedule
from tierax.train.validation import Validator, global_arrays


class NonFiniteLoss(RuntimeError):
    """The loss or gradient norm of a step was NaN or infinite; the run stopped."""

    def __init__(
        self, step: int, loss: float, grad_norm: float, last_checkpoint: int | None, directory
    ):
        self.step, self.loss, self.grad_norm, self.last_checkpoint = (
            step,
            loss,
            grad_norm,
            last_checkpoint,
        )
        where = (
            f"the last good checkpoint is step {last_checkpoint} in {directory}"
            if last_checkpoint is not None
            else "no checkpoint was written before it"
        )
        super().__init__(
            f"step {step}: loss is {loss} (gradient norm {grad_norm}); training stopped, the "
            f"diverged state was not saved; {where}"
        )


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
      tokens_seen: training tokens consumed by the run up to ``last_step`` (inputs, not targets).
      epochs: per dataset, epochs completed up to ``last_step`` (empty for synthetic data).
      validation: (step, validation loss) of the evaluations this call ran.
    """

    first_step: int
    last_step: int
    losses: tuple[float, ...]
    resumed_from: int | None
    last_checkpoint: int | None
    compile_s: float
    tokens_seen: int = 0
    epochs: tuple[float, ...] = ()
    validation: tuple[tuple[int, float], ...] = ()

    def to_json(self) -> dict:
        return {
            "first_step": self.first_step,
            "last_step": self.last_step,
            "losses": list(self.losses),
            "resumed_from": self.resumed_from,
            "last_checkpoint": self.last_checkpoint,
            "compile_s": self.compile_s,
            "tokens_seen": self.tokens_seen,
            "epochs": list(self.epochs),
            "validation": [list(v) for v in self.validation],
        }

    def summary(self, cfg: TrainConfig) -> str:
        """The line ``tierax train`` prints at the end."""
        if not self.losses:
            return (
                f"nothing to train: the run is already at step {self.first_step - 1} of {cfg.steps}"
            )
        epochs = ", ".join(f"{e:.3f}" for e in self.epochs)
        return (
            f"trained steps {self.first_step}–{self.last_step}: loss {self.losses[0]:.4f} → "
            f"{self.losses[-1]:.4f}"
            + (f", validation loss {self.validation[-1][1]:.4f}" if self.validation else "")
            + f"; {self.tokens_seen:,} tokens seen"
            + (f", epochs {epochs}" if epochs else "")
            + f"; metrics in {cfg.log.dir}/{METRICS}"
            + (f"; last checkpoint step {self.last_checkpoint}" if self.last_checkpoint else "")
        )


class Stopped(RuntimeError):
    """Training was interrupted (SIGINT / Ctrl-C) and stopped at a step boundary."""

    def __init__(self, step: int, last_checkpoint: int | None, directory):
        self.step, self.last_checkpoint = step, last_checkpoint
        where = (
            f"last checkpoint step {last_checkpoint} in {directory}; continue with --resume"
            if last_checkpoint is not None
            else "no checkpoint was written (checkpoint.every is 0)"
        )
        super().__init__(f"interrupted: stopped after step {step}; {where}")


class Interrupted(Stopped):
    """Ctrl-C stopped the run at once, not at a step boundary: a second Ctrl-C, or one before the
    loop began.  The message names the newest complete checkpoint on disk and how to go on."""

    def __init__(self, cfg: TrainConfig):
        d = cfg.checkpoint_dir
        done = ckpt_lib.complete_steps(d) if d is not None and d.is_dir() else []
        self.step, self.last_checkpoint = None, done[-1] if done else None
        where = (
            f"the last complete checkpoint is step {done[-1]} in {d}; continue with --resume"
            if done
            else "no complete checkpoint was written"
            + (f" in {d}" if d is not None else " (checkpoint.every is 0)")
            + "; start again"
        )
        RuntimeError.__init__(self, f"interrupted at once (not at a step boundary); {where}")


def run(cfg: TrainConfig, *, resume: bool = False, reporter: Reporter | None = None) -> TrainResult:
    """Build a :class:`Trainer` and train it to ``cfg.steps``, closing it after.

    Raises:
      NonFiniteLoss: as :meth:`Trainer.train`.
      Stopped: Ctrl-C, at a step boundary; :class:`Interrupted` where it stopped the run at once.
    """
    try:
        with Trainer(cfg, resume=resume, reporter=reporter) as t:
            return t.train()
    except KeyboardInterrupt as e:
        raise Interrupted(cfg) from e


# --- the trainer ------------------------------------------------------------------


class _StopFlag:
    set = False


@contextlib.contextmanager
def _stop_on_sigint():
    """A flag that SIGINT sets (instead of raising KeyboardInterrupt) while training; a second
    SIGINT raises."""
    flag = _StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        if flag.set:
            raise KeyboardInterrupt
        flag.set = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


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

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        resume: bool = False,
        devices=None,
        reporter: Reporter | None = None,
    ):
        self.cfg = cfg
        self.is_main = jax.process_index() == 0
        self.reporter = reporter if (reporter is not None and self.is_main) else Reporter()
        self.mesh = cfg.mesh.make(devices)
        shape = data_lib.BatchShape(cfg.grad_accum, cfg.global_batch, cfg.seq)
        self.stream = data_lib.open_stream(
            cfg.data, shape, seed=cfg.seed, vocab_size=cfg.model.vocab_size
        )
        validation = data_lib.open_validation(
            cfg.data,
            cfg.global_batch,
            cfg.seq,
            vocab_size=cfg.model.vocab_size,
            training=getattr(self.stream, "corpora", ()),
        )
        from tierax.train.data.streams import tokenizer_notes

        training = list(getattr(self.stream, "corpora", ()))
        held_out = [validation.corpus] if getattr(validation, "corpus", None) is not None else []
        for line in tokenizer_notes(training + held_out):
            self.reporter.note(line)
        self._masked = cfg.data.source == "tokens" and cfg.data.document_mask
        self.identity = cfg.identity()
        self.identity["data"].update(self.stream.identity())

        # --- checks, before anything is written --------------------------------
        self.ckpt_dir = cfg.checkpoint_dir
        self.log_dir = pathlib.Path(cfg.log.dir)
        done = ckpt_lib.complete_steps(self.ckpt_dir) if self.ckpt_dir else []
        broken = ckpt_lib.incomplete_steps(self.ckpt_dir) if self.ckpt_dir else []
        if broken:
            raise TieraxError(
                f"checkpoint.dir {self.ckpt_dir} has step directories that are not complete "
                f"checkpoints ({', '.join(str(self.ckpt_dir / str(b)) for b in broken)}: no commit "
                "record); move them away before training into this directory"
            )
        self.resumed_from = None
        if done and not resume:
            raise TieraxError(
                f"checkpoint.dir {self.ckpt_dir} already holds checkpoints (steps "
                f"{', '.join(map(str, done))}); "
                "pass --resume to continue that run, or use another checkpoint.dir / log.dir"
            )
        if done:
            meta = ckpt_lib.read_meta(self.ckpt_dir, done[-1])
            ckpt_lib.check_compatible(meta, self.identity, f"{self.ckpt_dir}/{done[-1]}")
            self.resumed_from = done[-1]
            if self.resumed_from >= cfg.steps:  # said now, not after compiling a step never run
                more = self.resumed_from + cfg.steps
                raise TieraxError(
                    f"checkpoint.dir {self.ckpt_dir} is at step {self.resumed_from} and steps is "
                    f"{cfg.steps}: nothing to train. To continue the run, raise steps (e.g. "
                    f"steps={more} optimizer.decay_steps={cfg.decay_steps}, which keeps its "
                    "learning-rate schedule)"
                )
        if not resume and (self.log_dir / METRICS).exists():
            raise TieraxError(
                f"log.dir {self.log_dir} already holds a run ({METRICS}); pass --resume to "
                "continue it, or use another log.dir"
            )
        if jax.process_count() > 1:  # nobody writes until every process has checked
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("tierax-train-checks")

        # --- state --------------------------------------------------------------
        self.schedule = lr_schedule(cfg)
        o = cfg.optimizer
        optimizer = step_lib.make_optimizer(
            self.schedule,
            o.weight_decay,
            b1=o.b1,
            b2=o.b2,
            eps=o.eps,
            grad_clip=o.grad_clip,
            mu_dtype=cfg.model.mu_dtype,
        )
        self._lrs = np.asarray(
            jax.jit(jax.vmap(self.schedule))(jnp.arange(cfg.steps))
        )  # [k - 1]: step k's rate
        graphdef, self.state = step_lib.init_state(
            cfg.model, optimizer, seed=cfg.seed, mesh=self.mesh, plan=cfg.plan
        )
        self.checkpointer = None
        if self.ckpt_dir:
            self.checkpointer = ckpt_lib.Checkpointer(
                self.ckpt_dir, keep=cfg.checkpoint.keep, asynchronous=cfg.checkpoint.async_save
            )
        if self.resumed_from is not None:
            self.state, _ = self.checkpointer.restore(self.resumed_from, self.state)
        self.step = int(_scalar(self.state.step))

        rows_axis = 0 if cfg.grad_accum == 1 else 1
        self._global_shape = shape.global_shape if cfg.grad_accum > 1 else shape.global_shape[1:]
        spec = P(BATCH_AXES) if cfg.grad_accum == 1 else P(None, BATCH_AXES)
        self._batch_sharding = NamedSharding(self.mesh, spec)
        self._rows = data_lib.local_rows(self._batch_sharding, self._global_shape, axis=rows_axis)

        self._step_fn = step_lib.make_train_step(
            graphdef,
            cfg.model,
            cfg.plan,
            optimizer,
            step_lib.shardings_of(self.state),
            grad_accum=cfg.grad_accum,
            grad_clip=o.grad_clip,
        )
        # Compiled ahead to time it; the loop then calls the jitted function, which reuses this
        # executable through JAX's caches and dispatches through its C++ fast path (calling the
        # Compiled object flattens the state in Python every step, a cost bench/train_overhead.py
        # would count).
        t0 = time.perf_counter()
        batch_spec = jax.ShapeDtypeStruct(
            self._global_shape, jnp.int32, sharding=self._batch_sharding
        )
        self._step_fn.lower(self.state, batch_spec, batch_spec if self._masked else None).compile()
        self.compile_s = time.perf_counter() - t0
        self.validator = Validator(cfg, self.mesh, graphdef, validation) if validation else None
        self._flops = train_flops(cfg.model, cfg.batch_per_step, cfg.seq)
        self._tokens = cfg.batch_per_step * cfg.seq

        # --- outputs (process 0) ------------------------------------------------
        self._log = None
        if self.is_main:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.log_dir / CONFIG_SNAPSHOT, config_to_yaml(cfg))
            self._log = MetricsLog(self.log_dir, keep_through=self.step)
        self._step_times: list[float] = []

    # --- pieces of a step -----------------------------------------------------------
    def batch(self, step: int) -> tuple[jax.Array, jax.Array | None]:
        """The global batch of ``step``, tokens and (document masking) segment ids; this
        process supplies its own rows."""
        tokens, segs = self.stream.batch(step, *self._rows)
        if self.cfg.grad_accum == 1:
            tokens, segs = tokens[0], (None if segs is None else segs[0])

        return global_arrays(self._batch_sharding, self._global_shape, tokens, segs)

    def _poison(self, state):
        # TEST-ONLY (debug.nan_at_step): NaN parameters make this step's loss NaN for real.
        def nan(params):
            return jax.tree.map(
                lambda x: x * jnp.nan if jnp.issubdtype(x.dtype, jnp.floating) else x, params
            )

        poisoned = {
            part: jax.jit(nan, out_shardings=step_lib.shardings_of(tree))(tree)
            for part in ("params", "compute_params")
            if (tree := getattr(state, part)) is not None
        }
        return state._replace(**poisoned)

    def _is_checkpoint_step(self, k: int) -> bool:
        return self.checkpointer is not None and (
            k % self.cfg.checkpoint.every == 0 or k == self.cfg.steps
        )

    def _latest_checkpoint(self) -> int | None:
        """The newest complete checkpoint, once every started save has finished."""
        if self.checkpointer is None:
            return None
        self.checkpointer.wait()
        done = ckpt_lib.complete_steps(self.ckpt_dir)
        return done[-1] if done else None

    def _complete(self, k: int, metrics, now: float | None = None) -> None:
        loss, gnorm = _scalar(metrics["loss"]), _scalar(metrics["grad_norm"])
        now = time.perf_counter() if now is None else now
        dt, self._t_last = now - self._t_last, now
        if not (math.isfinite(loss) and math.isfinite(gnorm)):
            # _latest_checkpoint waits: the last good checkpoint is complete on disk before we stop.
            raise NonFiniteLoss(k, loss, gnorm, self._latest_checkpoint(), self.ckpt_dir)
        self._losses.append(loss)
        self._step_times.append(dt)
        epochs = self.stream.epochs(k)
        rec = StepRecord(
            step=k,
            loss=loss,
            grad_norm=gnorm,
            lr=float(self._lrs[k - 1]),
            step_time_s=dt,
            tokens_per_s=self._tokens / dt,
            tflops_per_device=self._flops / dt / self.mesh.size / 1e12,
            time=time.time(),
            tokens_seen=k * self._tokens,
            epoch=max(epochs) if epochs else None,
            val_loss=self._val.get(k),
        )
        if self._log is not None:
            self._log.write(rec)
        recent = self._step_times[-20:]
        self.reporter.step(rec, eta_s=(self.cfg.steps - k) * sum(recent) / len(recent))

    def _save(self, k: int) -> None:
        meta = {
            "config": self.cfg.to_dict(),
            "identity": self.identity,
            "data": {"source": self.cfg.data.source, "seed": self.cfg.seed, "next_step": k + 1},
        }
        t0 = time.perf_counter()
        self.checkpointer.save(k, self.state, meta)
        self.reporter.note(
            f"checkpoint step {k} → {self.ckpt_dir} ({time.perf_counter() - t0:.2f} s blocking, "
            f"{'written in the background' if self.cfg.checkpoint.async_save else 'written'})"
        )

    # --- the loop -------------------------------------------------------------------
    def train(self, until: int | None = None) -> TrainResult:
        """Train from the current step to ``until`` (default: ``cfg.steps``).

        SIGINT (Ctrl-C) in the main thread stops at the next step boundary: that
        step's checkpoint is written (when checkpointing is on), then :class:`Stopped`.

        Raises:
          NonFiniteLoss: a step's loss or gradient norm was NaN or infinite.
          Stopped: interrupted.
        """
        with _stop_on_sigint() as stop:
            return self._train(until, stop)

    def _train(self, until: int | None, stop: _StopFlag) -> TrainResult:
        cfg = self.cfg
        until = cfg.steps if until is None else min(until, cfg.steps)
        first = self.step + 1
        self._losses: list[float] = []
        self._val: dict[int, float] = {}
        self.reporter.start(first, cfg.steps, self._title(first))
        self._t_last = time.perf_counter()
        pending = None
        try:
            for k in range(first, until + 1):
                if pending is not None and self._waited_for(k, until):
                    # A step waited for right after its dispatch is timed from the previous step's
                    # end, so that end is taken before this step's batch and dispatch: otherwise
                    # they run while the previous step finishes, count to it, and this step's time
                    # is its device time alone (a fraction of a millisecond for a small model after
                    # a slow step, as a resumed run's first).  The pipeline drains here anyway.
                    self._complete(*pending)
                    pending = None
                if cfg.debug.nan_at_step == k:
                    self.state = self._poison(self.state)
                self.state, metrics = self._step_fn(self.state, *self.batch(k))
                if pending is not None:
                    self._complete(*pending)
                pending = (k, metrics)
                if cfg.debug.step_delay_s:
                    time.sleep(cfg.debug.step_delay_s)  # TEST-ONLY
                if self._is_validation_step(k):
                    # With this step's parameters: its record carries the result, its time not.
                    jax.block_until_ready(metrics)
                    done = time.perf_counter()
                    self._val[k] = self.validator.loss(step_lib.model_params(self.state))
                    self.reporter.note(f"step {k}: validation loss {self._val[k]:.4f}")
                    self._complete(*pending, now=done)
                    pending = None
                    self._t_last = time.perf_counter()
                if self._is_checkpoint_step(k):
                    if pending is not None:
                        self._complete(*pending)  # its loss must be finite before it is saved
                        pending = None
                    self._save(k)
                    self._t_last = time.perf_counter()
                self.step = k
                if stop.set and k < until:
                    if pending is not None:
                        self._complete(*pending)
                        pending = None
                    if self.checkpointer is not None and not self._is_checkpoint_step(k):
                        self._save(k)
                    raise Stopped(k, self._latest_checkpoint(), self.ckpt_dir)
            if pending is not None:
                self._complete(*pending)
        finally:
            self.reporter.stop()
        return TrainResult(
            first,
            until,
            tuple(self._losses),
            self.resumed_from,
            self._latest_checkpoint(),
            self.compile_s,
            tokens_seen=until * self._tokens,
            epochs=tuple(self.stream.epochs(until)),
            validation=tuple(sorted(self._val.items())),
        )

    def _waited_for(self, k: int, until: int) -> bool:
        """Whether the loop waits for step ``k`` right after dispatching it: validation,
        checkpoint, the last step of this call."""
        return self._is_validation_step(k) or self._is_checkpoint_step(k) or k == until

    def _is_validation_step(self, k: int) -> bool:
        every = self.cfg.data.validation_every
        return self.validator is not None and (k % every == 0 or k == self.cfg.steps)

    def _title(self, first: int) -> str:
        cfg = self.cfg
        start = (
            f"resuming from checkpoint step {self.resumed_from}"
            if self.resumed_from is not None
            else "fresh start"
        )
        return (
            f"data {self.stream.describe()}"
            + (" · document masking" if self._masked else "")
            + "\n"
            f"train {cfg.model.name} · plan {cfg.plan.name} · mesh {cfg.mesh} "
            f"({jax.device_count()} {jax.devices()[0].platform} device(s), {jax.process_count()} "
            f"process(es)) · {cfg.microbatch}/device × {cfg.grad_accum} accum = "
            f"{cfg.batch_per_step} seq × {cfg.seq} tokens · steps {first}–{cfg.steps} ({start}) · "
            f"compiled in {self.compile_s:.1f} s"
        )

    def close(self) -> None:
        """Finish pending checkpoint writes and close the log (process 0).  The caller draws
        the metrics plot (``tierax.report.metrics_plot``) if it wants one."""
        if self.checkpointer is not None:
            self.checkpointer.wait()
            self.checkpointer.close()
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
