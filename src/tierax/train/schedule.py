"""The learning-rate schedule of a training run."""

from __future__ import annotations

import optax


def lr_schedule(cfg) -> optax.Schedule:
    """Linear warm-up from 0 to ``optimizer.lr`` at step ``warmup_steps``, then cosine decay to
    ``lr × end_lr_ratio`` at step ``decay_steps`` (``optax.warmup_cosine_decay_schedule``).

    Optax calls a schedule with the update count (0 for step 1); it is shifted by one so
    that step ``k`` trains at the schedule's value at ``k``: the first step's rate is
    ``lr / warmup_steps``, not 0.
    """
    o = cfg.optimizer
    base = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=o.lr,
        warmup_steps=o.warmup_steps,
        decay_steps=cfg.decay_steps,
        end_value=o.lr * o.end_lr_ratio,
    )
    return lambda count: base(count + 1)
