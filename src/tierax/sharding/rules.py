"""Parameter sharding over a :mod:`tierax.mesh` mesh: FSDP, Megatron tensor parallelism, experts.

The batch is split over :data:`tierax.mesh.BATCH_AXES` (data × fsdp × expert).
Rules, by parameter (the stacked-layer axis of a scanned group is never split):

* column-parallel kernels — attention q/k/v (GQA ``wq``/``wk``/``wv``, MLA ``wq_b``/``wkv_b``)
  and MLP up-projections (``wi_0``/``wi_1``): output dimension over ``tensor``;
* row-parallel kernels — attention and MLP ``wo``: input dimension over ``tensor``;
* routed experts (MoE ``wi_0``/``wi_1``/``wo`` of shape [E, ...]): E over ``expert``, the
  hidden dimension over ``tensor``, the model dimension over ``fsdp``;
* every other dimension of a non-expert weight is FSDP-sharded over
  :data:`tierax.mesh.FSDP_AXES` (fsdp × expert) along its largest divisible dimension
  (or over ``fsdp`` alone if only that divides); nothing divisible: replicated there.

fp8 delayed-scaling state (attributes named ``fp8_*``: scales and amax histories, a few KB per
GEMM, tierax.models.fp8) is replicated: every device reads it whole.

Axes of size 1 never appear in a spec.  Optimizer state follows its parameter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tierax.mesh import BATCH_AXES, FSDP_AXES, mesh_shape_of, spec

COLUMN_PARALLEL = frozenset({"wq", "wk", "wv", "wq_b", "wkv_b", "wi_0", "wi_1"})
ROW_PARALLEL = frozenset({"wo"})
EXPERT_WEIGHTS = frozenset({"wi_0", "wi_1", "wo"})  # as direct Params of an MoE module
FP8_STATE_PREFIX = "fp8_"  # tierax.models.fp8.PREFIX (models sit above this layer)


def _keys(path) -> list[str]:
    """Dict keys of a parameter's path (the Variable's trailing ``.value`` attribute left out)."""
    return [str(k.key) for k in path if hasattr(k, "key")]


def _is_stacked(path) -> bool:
    return "groups" in _keys(path)


def _axis_sizes(mesh) -> dict[str, int]:
    """Axis sizes of a Mesh, a mapping of axis sizes, or an int (the fsdp-only form: that many fsdp
    devices)."""
    if isinstance(mesh, int):
        return {"data": 1, "fsdp": mesh, "tensor": 1, "expert": 1}
    sizes = mesh if isinstance(mesh, Mapping) else mesh.shape
    return {a: int(s) for a, s in sizes.items()}


def _ways(sizes: dict[str, int], axes) -> int:
    return math.prod(sizes.get(a, 1) for a in ((axes,) if isinstance(axes, str) else axes))


def _fsdp_dim(shape, first: int, taken: set[int], sizes, candidates) -> tuple[int, tuple] | None:
    """(dimension, axes) of the largest free dimension divisible by the first candidate axes that
    divide any."""
    for axes in candidates:
        ways = _ways(sizes, axes)
        if ways == 1:
            return None
        best = None
        for d in range(first, len(shape)):
            if d not in taken and shape[d] % ways == 0 and (best is None or shape[d] > shape[best]):
                best = d
        if best is not None:
            return best, axes
    return None


def param_spec(path, shape: tuple[int, ...], mesh) -> P:
    """The PartitionSpec of one parameter (``mesh``: a Mesh, a mapping of axis sizes, or an fsdp
    size)."""
    sizes = _axis_sizes(mesh)
    if not shape or math.prod(sizes.values()) == 1:
        return P()
    keys = _keys(path)
    first = 1 if _is_stacked(path) else 0
    dims: list = [None] * len(shape)
    leaf = keys[-1] if keys else ""
    if leaf.startswith(FP8_STATE_PREFIX):
        return P()
    owner = keys[-2] if len(keys) >= 2 else ""
    t, e = sizes.get("tensor", 1), sizes.get("expert", 1)
    expert_weight = leaf in EXPERT_WEIGHTS and len(shape) - first == 3
    if expert_weight:  # [E, D, F] (wi_*) or [E, F, D] (wo)
        if e > 1 and shape[first] % e == 0:
            dims[first] = "expert"
        hidden = first + (2 if leaf != "wo" else 1)
        model = first + (1 if leaf != "wo" else 2)
        if t > 1 and shape[hidden] % t == 0:
            dims[hidden] = "tensor"
        fsdp = _fsdp_dim(shape, model, set(range(len(shape))) - {model}, sizes, ("fsdp",))
    else:
        if t > 1 and leaf == "kernel" and len(shape) - first == 2:
            if owner in COLUMN_PARALLEL and shape[-1] % t == 0:
                dims[-1] = "tensor"
            elif owner in ROW_PARALLEL and shape[-2] % t == 0:
                dims[-2] = "tensor"
        taken = {i for i, d in enumerate(dims) if d is not None}
        fsdp = _fsdp_dim(shape, first, taken, sizes, (FSDP_AXES, "fsdp"))
    if fsdp is not None:
        dims[fsdp[0]] = fsdp[1]
    return _drop_unit(sizes, dims)


def _drop_unit(sizes, dims) -> P:
    def keep(d):
        if d is None:
            return None
        names = tuple(a for a in ((d,) if isinstance(d, str) else d) if sizes.get(a, 1) > 1)
        return None if not names else names[0] if len(names) == 1 else names

    return P(*(keep(d) for d in dims))


def param_shardings(params, mesh: Mesh):
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, param_spec(path, tuple(x.shape), mesh)), params
    )


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Tokens [batch, seq + 1]: the batch over :data:`BATCH_AXES`."""
    return NamedSharding(mesh, spec(mesh, BATCH_AXES))


def check_batch(batch: int, mesh: Mesh) -> None:
    """Refuse a global batch the batch axes do not divide (message names the numbers and fix)."""
    mesh_shape_of(mesh).check_batch(batch, where="microbatch")


def check_step(cfg, mesh: Mesh, batch: int | None = None) -> None:
    """Everything a step on ``mesh`` needs of ``cfg`` (and of the global ``batch``, if given).

    Raises:
      TieraxError: heads / kv heads / MLP or expert hidden sizes not divisible by
        ``tensor``, experts not divisible by ``expert``, or a batch not divisible by
        data × fsdp × expert.
    """
    shape = mesh_shape_of(mesh)
    shape.check_model(cfg)
    if batch is not None:
        shape.check_batch(batch, where="global batch")
