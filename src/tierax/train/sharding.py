"""FSDP parameter sharding over a :mod:`tierax.mesh` mesh.

The batch is split over :data:`tierax.mesh.BATCH_AXES`.  Each
parameter is split over ``fsdp`` along its largest dimension divisible by the
axis size (never the stacked-layer axis of a scanned group); a parameter with no
such dimension is replicated.  Optimizer state follows its parameter.
"""

from __future__ import annotations

import math

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tierax.errors import TieraxError
from tierax.mesh import BATCH_AXES


def _is_stacked(path) -> bool:
    return any(getattr(k, "key", None) == "groups" for k in path)


def param_spec(path, shape: tuple[int, ...], fsdp: int) -> P:
    if fsdp == 1 or not shape:
        return P()
    first = 1 if _is_stacked(path) else 0
    best = None
    for d in range(first, len(shape)):
        if shape[d] % fsdp == 0 and (best is None or shape[d] > shape[best]):
            best = d
    if best is None:
        return P()
    spec = [None] * len(shape)
    spec[best] = "fsdp"
    return P(*spec)


def param_shardings(params, mesh: Mesh):
    fsdp = mesh.shape["fsdp"]
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, param_spec(path, tuple(x.shape), fsdp)), params
    )


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(BATCH_AXES))


def check_batch(batch: int, mesh: Mesh) -> None:
    ways = math.prod(mesh.shape[a] for a in BATCH_AXES)
    if batch % ways:
        raise TieraxError(
            f"microbatch {batch} is not divisible by data×fsdp = {ways}; use a multiple of {ways}"
        )
