"""MaxText's abstract train state on the run's mesh sizes (its model and optimizer, nothing
allocated): what the trace and the weight-stack terms read."""

from __future__ import annotations


def abstract_mesh(config):
    from jax.sharding import AbstractMesh, AxisType

    sizes = tuple(
        (1 if i == -1 else i) * (1 if d == -1 else d)
        for i, d in zip(config.ici_parallelism, config.dcn_parallelism, strict=True)
    )
    return AbstractMesh(sizes, tuple(config.mesh_axes), axis_types=(AxisType.Auto,) * len(sizes))


def abstract_state(config):
    """MaxText's abstract train state (model + its optimizer), sharded on the run's mesh sizes."""
    from flax import nnx
    from maxtext.common import train_state_nnx
    from maxtext.utils import maxtext_utils, model_creation_utils, train_utils

    mesh = abstract_mesh(config)
    create, model = model_creation_utils.create_nnx_abstract_model(config, mesh)
    _, tx = train_utils.create_training_optimizer(config, model, mesh=mesh)

    def init_state():
        m = create()
        return train_state_nnx.TrainStateNNX(m, nnx.Optimizer(m, tx, wrt=nnx.Param))

    state, _, _ = maxtext_utils.get_abstract_state_nnx(config, mesh, init_state, True)
    return state
