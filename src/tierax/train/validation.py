"""The validation loss of a run: the step's loss, without gradients, over fixed held-out batches.

``data.validation_every`` steps the trainer averages the loss over the first
``data.validation_batches`` global batches of the validation data
(:class:`~tierax.train.data.SequentialLoader`): the same batches every time, so the numbers
of one run compare with each other.  Each process supplies its own rows of every batch.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tierax import plan as plan_lib
from tierax.mesh import BATCH_AXES
from tierax.train import data as data_lib
from tierax.train import step as step_lib


def global_arrays(sharding, shape, tokens, segs):
    """(tokens, segment ids or None) as global arrays; this process supplies its own rows."""

    def put(local):
        return jax.make_array_from_process_local_data(sharding, local, shape)

    return put(tokens), (None if segs is None else put(segs))


class Validator:
    """The jitted loss and this process's rows of the validation batches (one microbatch each).

    Args:
      cfg: the run (:class:`~tierax.train.config.TrainConfig`).
      mesh: the step's mesh.
      graphdef: the model's graph definition.
      loader: the validation batches.
    """

    def __init__(self, cfg, mesh, graphdef, loader: data_lib.SequentialLoader):
        self.loader = loader
        self.sharding = NamedSharding(mesh, P(BATCH_AXES))  # rows over the batch axes (as the step)
        self.shape = (cfg.global_batch, cfg.seq + 1)
        self.rows = data_lib.local_rows(self.sharding, self.shape, axis=0)
        loss_fn = step_lib.make_loss_fn(
            graphdef, plan_lib.to_policies(cfg.plan, cfg.model), None if mesh.size == 1 else mesh
        )
        self._fn = jax.jit(loss_fn, out_shardings=NamedSharding(mesh, P()))

    def loss(self, params) -> float:
        """The mean loss over the validation batches."""
        total = 0.0
        for v in range(self.loader.batches):
            batch = global_arrays(self.sharding, self.shape, *self.loader.batch(v, *self.rows))
            # Replicated: this process's first shard holds the value.
            total += float(np.asarray(self._fn(params, *batch).addressable_data(0)))
        return total / self.loader.batches
