"""The sections of a training config (``optimizer``, ``data``, ``checkpoint``, ``log``,
``runtime``, ``debug``; ``mesh`` is :class:`tierax.mesh.MeshShape`), each a frozen
dataclass whose ``__post_init__`` names the problem and the fix."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tierax.errors import TieraxError
from tierax.mesh import MeshShape

COMPUTE_DTYPES = ("model", "float32", "bfloat16")
DATA_SOURCES = ("synthetic", "tokens")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise TieraxError(msg)


# --- sections -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """AdamW with linear warm-up then cosine decay (``optax.warmup_cosine_decay_schedule``).

    The learning rate rises from 0 to ``lr`` over ``warmup_steps``, then decays to
    ``lr × end_lr_ratio`` at ``decay_steps`` (default: the run's ``steps``).
    """

    lr: float = 3e-3
    warmup_steps: int = 10
    decay_steps: int | None = None
    end_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    grad_clip: float | None = 1.0

    def __post_init__(self) -> None:
        _check(self.lr > 0, f"optimizer.lr must be > 0, got {self.lr}")
        _check(
            self.warmup_steps >= 0, f"optimizer.warmup_steps must be ≥ 0, got {self.warmup_steps}"
        )
        _check(
            0 <= self.end_lr_ratio <= 1,
            f"optimizer.end_lr_ratio must be in [0, 1], got {self.end_lr_ratio}",
        )
        _check(
            self.weight_decay >= 0, f"optimizer.weight_decay must be ≥ 0, got {self.weight_decay}"
        )
        for key in ("b1", "b2"):
            _check(
                0 <= getattr(self, key) < 1,
                f"optimizer.{key} must be in [0, 1), got {getattr(self, key)}",
            )
        _check(self.eps > 0, f"optimizer.eps must be > 0, got {self.eps}")
        _check(
            self.grad_clip is None or self.grad_clip > 0,
            f"optimizer.grad_clip must be > 0 or null (no clipping), got {self.grad_clip}",
        )


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where batches come from (:mod:`tierax.train.data`).

    ``source``: ``synthetic`` (uniform random tokens) or ``tokens``: ``path`` is a directory
    written by ``tierax data prepare``, a ``.npy`` or raw ``.bin`` token array (raw: give
    ``dtype``), or a Megatron dataset prefix; or ``mixture`` (instead of ``path``) is
    ``PATH=WEIGHT,PATH=WEIGHT,...``.  ``document_mask``: attend within each document only
    (positions restart per document).  ``validation_every`` steps (0: never) the loss over
    ``validation_batches`` batches of ``validation_path`` (a token directory: its validation
    split where it has one; default: ``path``'s validation split) is logged; validation data with
    the training data's content, or another tokenizer's, is refused.  ``verify``: check every
    shard's SHA-256 at start.
    """

    source: str = "synthetic"
    path: str | None = None
    mixture: str | None = None
    dtype: str | None = None
    document_mask: bool = False
    validation_path: str | None = None
    validation_every: int = 0
    validation_batches: int = 4
    verify: bool = True

    def __post_init__(self) -> None:
        _check(
            self.source in DATA_SOURCES,
            f"data.source={self.source!r} is not a data source; use one of: "
            f"{', '.join(DATA_SOURCES)}",
        )
        if self.source == "tokens":
            _check(
                self.path is not None or self.mixture is not None,
                "data.source is tokens but data.path is not set; give the directory `tierax data "
                "prepare` wrote",
            )
            _check(
                self.path is None or self.mixture is None,
                "data.path and data.mixture are both set; give one (a mixture lists its paths)",
            )
            if self.mixture is not None:
                self.datasets()
        else:
            _check(
                self.path is None and self.mixture is None,
                "data.path is set but data.source is synthetic; set data.source: tokens",
            )
            _check(
                not self.document_mask, "data.document_mask needs token data (data.source: tokens)"
            )
            _check(
                not self.validation_every,
                "data.validation_every needs token data (data.source: tokens)",
            )
        _check(
            self.validation_every >= 0,
            f"data.validation_every must be ≥ 0 (0: never), got {self.validation_every}",
        )
        _check(
            self.validation_batches >= 1,
            f"data.validation_batches must be ≥ 1, got {self.validation_batches}",
        )

    def datasets(self) -> list[tuple[str, float]]:
        """(path, weight) of each dataset: ``path`` with weight 1, or the parsed ``mixture``."""
        if self.mixture is None:
            return [(self.path, 1.0)]
        out = []
        for item in self.mixture.split(","):
            path, sep, weight = item.strip().rpartition("=")
            try:
                w = float(weight)
            except ValueError:
                w = float("nan")
            _check(
                bool(sep) and bool(path) and 0 < w < float("inf"),
                f"data.mixture item {item.strip()!r} is not PATH=WEIGHT with a positive weight; "
                "write e.g. data.mixture=runs/web=0.7,runs/books=0.3",
            )
            out.append((path, w))
        seen: dict[str, str] = {}
        for path, _ in out:
            same = os.path.realpath(os.path.expanduser(path))
            _check(
                same not in seen,
                f"data.mixture names one dataset twice ({seen.get(same)!r} and {path!r}): its "
                "documents would be drawn as two datasets; list it once with the weights added",
            )
            seen[same] = path
        _check(
            len(out) >= 1,
            "data.mixture is empty; write e.g. data.mixture=runs/web=0.7,runs/books=0.3",
        )
        return out


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Orbax checkpoints every ``every`` steps and at the last step (``every: 0``: none);
    the ``keep`` most recent are kept.  ``dir`` defaults to ``<log.dir>/checkpoints``."""

    dir: str | None = None
    every: int = 100
    keep: int = 3
    async_save: bool = True

    def __post_init__(self) -> None:
        _check(
            self.every >= 0, f"checkpoint.every must be ≥ 0 (0: no checkpoints), got {self.every}"
        )
        _check(self.keep >= 1, f"checkpoint.keep must be ≥ 1, got {self.keep}")


@dataclass(frozen=True, kw_only=True)
class LogConfig:
    """``dir`` receives ``metrics.jsonl`` (one JSON object per step), the resolved
    config and ``metrics.png``; a progress line is printed every ``every`` steps."""

    dir: str = "runs/train"
    every: int = 10
    plot: bool = True

    def __post_init__(self) -> None:
        _check(self.every >= 1, f"log.every must be ≥ 1, got {self.every}")


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """GPU runtime memory settings derived at start-up (ignored on CPU).

    ``device_budget_gb`` with ``target`` sets ``XLA_PYTHON_CLIENT_MEM_FRACTION``;
    ``host_budget_gb`` (default: the plan's offloaded bytes with headroom) sets
    ``XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB``.
    """

    target: str | None = None
    device_budget_gb: float | None = None
    host_budget_gb: float | None = None

    def __post_init__(self) -> None:
        if self.target is not None:
            from tierax import hardware

            hardware.get_target(self.target)
        _check(
            self.device_budget_gb is None or self.device_budget_gb > 0,
            f"runtime.device_budget_gb must be > 0, got {self.device_budget_gb}",
        )
        _check(
            self.host_budget_gb is None or self.host_budget_gb > 0,
            f"runtime.host_budget_gb must be > 0, got {self.host_budget_gb}",
        )
        _check(
            self.device_budget_gb is None or self.target is not None,
            "runtime.device_budget_gb needs runtime.target (its device memory size) to become a "
            "memory fraction",
        )


@dataclass(frozen=True, kw_only=True)
class DebugConfig:
    """TEST-ONLY knobs.  ``nan_at_step``: the parameters are poisoned with NaN just
    before that step, so its loss is NaN (exercises the divergence stop);
    ``step_delay_s``: sleep after each step (gives tests a window to kill a run)."""

    nan_at_step: int | None = None
    step_delay_s: float = 0.0

    def __post_init__(self) -> None:
        _check(
            self.nan_at_step is None or self.nan_at_step >= 1,
            f"debug.nan_at_step must be ≥ 1, got {self.nan_at_step}",
        )
        _check(self.step_delay_s >= 0, f"debug.step_delay_s must be ≥ 0, got {self.step_delay_s}")


SECTIONS: dict[str, type] = {
    "mesh": MeshShape,
    "optimizer": OptimizerConfig,
    "data": DataConfig,
    "checkpoint": CheckpointConfig,
    "log": LogConfig,
    "runtime": RuntimeConfig,
    "debug": DebugConfig,
}
