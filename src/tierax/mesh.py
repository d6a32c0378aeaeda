"""The one mesh value: axis sizes (data, fsdp, tensor, expert), parsed once.

Every verb that builds, compiles, runs or models a step takes its mesh from
:func:`parse_mesh` (``--mesh`` / ``--devices``) or from a train config's ``mesh``
section, and turns it into a :class:`jax.sharding.Mesh` with :meth:`MeshShape.make`.
The JAX mesh always has all four axes (size-1 axes included), so partition specs
can name any of them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from tierax.errors import TieraxError

AXES = ("data", "fsdp", "tensor", "expert")
# The batch is split over these axes (sequences per device = global batch / their product).
BATCH_AXES = ("data", "fsdp")


@dataclass(frozen=True)
class MeshShape:
    """Device mesh axis sizes.

    ``data``: pure data parallelism (parameters replicated); ``fsdp``: data
    parallelism with parameters, gradients and optimizer state sharded;
    ``tensor``: Megatron-style tensor parallelism; ``expert``: MoE experts split
    along the expert dimension.
    """

    data: int = 1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1

    def __post_init__(self) -> None:
        for axis in AXES:
            value = getattr(self, axis)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TieraxError(f"mesh axis {axis} must be an integer ≥ 1, got {value!r}")

    @property
    def size(self) -> int:
        """Devices the mesh spans."""
        return math.prod(getattr(self, a) for a in AXES)

    @property
    def batch_ways(self) -> int:
        """How many ways the batch is split (product of :data:`BATCH_AXES`)."""
        return math.prod(getattr(self, a) for a in BATCH_AXES)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def __str__(self) -> str:
        return ",".join(f"{a}={getattr(self, a)}" for a in AXES)

    def require_step_axes(self, where: str) -> None:
        """Refuse tensor/expert > 1 where a real step is built (data and fsdp only so far)."""
        for axis in ("tensor", "expert"):
            if getattr(self, axis) != 1:
                raise TieraxError(
                    f"{where} {axis}={getattr(self, axis)}: tierax shards over data and fsdp only so far; "
                    f"use {axis}=1 and put the devices on fsdp"
                )

    def make(self, devices=None):
        """The :class:`jax.sharding.Mesh` over ``devices`` (default: all), axes :data:`AXES`.

        Raises:
          TieraxError: the mesh's product is not the number of devices.
        """
        import jax
        import numpy as np
        from jax.sharding import Mesh

        devices = list(jax.devices() if devices is None else devices)
        if self.size != len(devices):
            raise TieraxError(
                f"mesh {self} = {self.size} devices, but {len(devices)} are available; "
                "make the product equal the device count"
            )
        return Mesh(np.array(devices).reshape(tuple(getattr(self, a) for a in AXES)), AXES)


def make_mesh(data: int = 1, fsdp: int = 1, devices=None, *, tensor: int = 1, expert: int = 1):
    """Shorthand for ``MeshShape(data, fsdp, tensor, expert).make(devices)``."""
    return MeshShape(data, fsdp, tensor, expert).make(devices)


def parse_mesh(text: str | None, devices: int | None = None, *, option: str = "--mesh") -> MeshShape:
    """``data=N,fsdp=N,tensor=N,expert=N`` (any subset, the rest 1) reconciled with ``--devices``.

    Without ``text`` the mesh is ``fsdp=devices`` (1 device when both are None).

    Raises:
      TieraxError: bad syntax, an unknown axis, a size < 1, a repeated axis, or a
        product different from ``devices``.
    """
    if devices is not None and devices < 1:
        raise TieraxError(f"--devices must be ≥ 1, got {devices}")
    if not text:
        return MeshShape(fsdp=devices or 1)
    sizes: dict[str, int] = {}
    for part in text.split(","):
        key, sep, val = part.strip().partition("=")
        if not sep or key not in AXES or not val.strip().isdigit() or int(val) < 1:
            raise TieraxError(
                f"{option} {text!r}: expected comma-separated axis=N with axes {', '.join(AXES)} and N ≥ 1, "
                "e.g. fsdp=16,expert=8"
            )
        if key in sizes:
            raise TieraxError(f"{option} {text!r}: axis {key} is given twice; give each axis once")
        sizes[key] = int(val)
    shape = MeshShape(**sizes)
    if devices is not None and devices != shape.size:
        raise TieraxError(
            f"{option} {text} has {shape.size} devices but --devices is {devices}; "
            "make the mesh product equal the device count"
        )
    return shape
