"""Orbax checkpoints of a training run.

A checkpoint of step ``k`` (the state after ``k`` optimizer updates) is one
``orbax.checkpoint.CheckpointManager`` step with two items:

* ``state`` — the :class:`~tierax.train.step.TrainState` (parameters, optimizer
  state, step counter), sharded arrays saved by every process, each from (and restored into) the
  memory its sharding names: a plan's offloaded moments and master weights stay in host memory.
  The compute-dtype copies of offloaded master weights are derived state: not saved, cast again
  from the restored masters (:func:`tierax.train.masters.derive`);
* ``meta`` — JSON: the run config (loadable form), its :meth:`identity`, the data
  position (batches are a function of ``(seed, step)``, so the next step is the
  position) and the step.

Saves are asynchronous where Orbax allows (the device-to-host copy blocks, the
write does not).  Orbax writes a step into a temporary directory and renames it
when complete; a step counts as complete only if Orbax lists it *and* it carries
Orbax's commit record (``commit_success.txt``, or a commit time in
``_CHECKPOINT_METADATA``), so an interrupted save is never resumed from.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp

from tierax.errors import TieraxError

SCHEMA = "tierax.checkpoint/1"
ITEMS = ("state", "meta")
_COMMIT_FILE = "_CHECKPOINT_METADATA"


def _saved(state):
    """What a checkpoint holds of ``state``: a TrainState without its derived compute copies."""
    if getattr(state, "compute_params", None) is not None:
        return state._replace(compute_params=None)
    return state


def _committed(directory: pathlib.Path, step: int) -> bool:
    # Orbax records the commit time in the step's metadata when it finalizes it; some
    # versions (and non-atomic file systems) mark completion with commit_success.txt.
    path = directory / str(step)
    if (path / "commit_success.txt").is_file():
        return True
    try:
        info = json.loads((path / _COMMIT_FILE).read_text())
    except (OSError, ValueError):
        return False
    return bool(info.get("commit_timestamp_nsecs"))


def _steps(directory: str | os.PathLike) -> tuple[list[int], list[int]]:
    d = pathlib.Path(directory)
    if not d.is_dir():
        return [], []
    # Orbax's own listing leaves out its temporary (unfinished) step directories.
    steps = sorted(ocp.path.step.checkpoint_steps(d))
    return [s for s in steps if _committed(d, s)], [s for s in steps if not _committed(d, s)]


def complete_steps(directory: str | os.PathLike) -> list[int]:
    """Steps with a complete checkpoint in ``directory``, ascending; reads only."""
    return _steps(directory)[0]


def incomplete_steps(directory: str | os.PathLike) -> list[int]:
    """Step directories Orbax lists but that record no commit: not checkpoints.  They are
    never resumed from, but Orbax would count them against ``keep`` (deleting good
    checkpoints) and refuse to save their step, so a run must not start beside them."""
    return _steps(directory)[1]


def read_meta(directory: str | os.PathLike, step: int) -> dict[str, Any]:
    """The ``meta`` item of one checkpoint; reads only.

    Raises:
      TieraxError: the checkpoint has no readable tierax metadata.
    """
    d = pathlib.Path(directory).absolute()
    try:
        meta = ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(d / str(step) / "meta")
    except Exception as e:  # Orbax raises several types for a foreign or damaged directory
        raise TieraxError(
            f"checkpoint {d / str(step)} has no readable tierax metadata ({type(e).__name__}: "
            f"{e}); "
            "use another checkpoint.dir"
        ) from None
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        raise TieraxError(
            f"checkpoint {d / str(step)} was not written by tierax train ({SCHEMA}); "
            "use another checkpoint.dir"
        )
    return meta


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Human-readable differences between two JSON-like values."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                out.append(
                    f"{sub}: {'missing' if k not in a else a[k]!r} (checkpoint) vs "
                    f"{'missing' if k not in b else b[k]!r} (this run)"
                )
            else:
                out += _diff(a[k], b[k], sub)
        return out
    return [] if a == b else [f"{path}: {a!r} (checkpoint) vs {b!r} (this run)"]


def check_compatible(meta: dict[str, Any], identity: dict[str, Any], where: str) -> None:
    """Raise if a checkpoint's run identity differs from this run's.

    Raises:
      TieraxError: naming every mismatched field.
    """
    # A JSON round trip makes tuples lists, as in the stored copy.
    diffs = _diff(meta.get("identity"), json.loads(json.dumps(identity)))
    if diffs:
        if any(d.startswith("optimizer.decay_steps") for d in diffs):
            diffs.append(
                "(the schedule's length is `steps` unless optimizer.decay_steps is set; to train "
                "an existing run longer, keep its schedule with optimizer.decay_steps=<its steps>)"
            )
        raise TieraxError(
            f"checkpoint {where} belongs to a different run; mismatched: "
            + "; ".join(diffs)
            + ". Use another checkpoint.dir (or log.dir), or the config that wrote it"
        )


class Checkpointer:
    """Writes and restores the checkpoints of one run (every process calls every method)."""

    def __init__(self, directory: str | os.PathLike, *, keep: int, asynchronous: bool = True):
        self.directory = pathlib.Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            enable_async_checkpointing=asynchronous,
            cleanup_tmp_directories=True,  # leftovers of a killed save
            create=True,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    def _failed(self, what: str, e: BaseException, *, exclude: int | None = None) -> TieraxError:
        good = [s for s in complete_steps(self.directory) if s != exclude]
        last = (
            f"the last good checkpoint is step {good[-1]} in {self.directory}"
            if good
            else f"no complete checkpoint exists in {self.directory}"
        )
        reason = getattr(e, "strerror", None) or str(e).splitlines()[0][:200] or type(e).__name__
        return TieraxError(f"{what} failed ({type(e).__name__}: {reason}); {last}")

    def save(self, step: int, state, meta: dict[str, Any]) -> None:
        """Start saving ``state`` as step ``step``; returns once the state may be donated.

        Raises:
          TieraxError: the save (or an earlier asynchronous one) failed, e.g. the disk is
            full; the message names the last good checkpoint.
        """
        meta = {"schema": SCHEMA, "step": step, **meta}
        state = _saved(state)
        try:
            self._manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
                ),
                force=True,
            )
        except Exception as e:  # noqa: BLE001 — Orbax raises many types; the user needs the last good step
            raise self._failed(
                f"writing checkpoint step {step} (or the asynchronous save before it)",
                e,
                exclude=step,
            ) from e

    def restore(self, step: int, like):
        """(state, meta) of step ``step``; ``like`` gives the tree, shapes, dtypes and shardings.

        Raises:
          TieraxError: the checkpoint cannot be read (damaged); names the previous complete one.
        """
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), _saved(like)
        )
        try:
            out = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
                ),
            )
        except Exception as e:  # noqa: BLE001
            err = self._failed(f"reading checkpoint step {step}", e, exclude=step)
            raise TieraxError(
                f"{err}; move {self.directory / str(step)} away and --resume again to continue "
                "from it"
            ) from e
        state = out.state
        compute = getattr(like, "compute_params", None)
        if compute is not None:
            from tierax.train import masters

            state = state._replace(compute_params=masters.derive(state.params, compute))
        return state, out.meta

    def wait(self) -> None:
        """Block until every started save is complete on disk.

        Raises:
          TieraxError: an asynchronous save failed; names the last good checkpoint.
        """
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            raise self._failed("writing a checkpoint", e) from e

    def close(self) -> None:
        self._manager.close()
