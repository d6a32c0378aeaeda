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
# As in MaxText, the expert axis also splits the batch (and the non-expert weights, with fsdp).
BATCH_AXES = ("data", "fsdp", "expert")
# Non-expert weights are FSDP-sharded over these axes; expert weights over ``fsdp`` only
# (their expert dimension takes ``expert``).
FSDP_AXES = ("fsdp", "expert")


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

    def check_model(self, cfg, *, where: str = "mesh", config_keys: bool = False) -> None:
        """Refuse a mesh whose tensor/expert axes do not divide what they shard in ``cfg``.

        Tensor parallelism splits attention heads (and key/value heads) and MLP hidden
        dimensions; expert parallelism splits the routed experts.

        Raises:
          TieraxError: naming the numbers and the fix.
        """
        t, e = self.tensor, self.expert
        problems = []
        if t > 1:
            dims = [("num_heads", cfg.num_heads)]
            if cfg.family == "llama":
                dims += [("num_kv_heads", cfg.num_kv_heads), ("mlp_dim", cfg.mlp_dim)]
            else:
                dims += [
                    ("dense_mlp_dim", cfg.dense_mlp_dim),
                    ("expert_mlp_dim", cfg.expert_mlp_dim),
                ]
                if cfg.num_shared_experts:
                    dims.append(
                        (
                            "num_shared_experts×expert_mlp_dim",
                            cfg.num_shared_experts * cfg.expert_mlp_dim,
                        )
                    )
            problems += [
                f"{name}={value} is not divisible by tensor={t}"
                for name, value in dims
                if value % t
            ]
        # A dense model on an expert axis is fine: the axis then splits the batch and weights only.
        if e > 1 and getattr(cfg, "num_experts", 0):
            if cfg.num_experts % e:
                problems.append(f"num_experts={cfg.num_experts} is not divisible by expert={e}")
        if problems:
            fix = "choose tensor/expert sizes that divide them (or move those devices to fsdp/data)"
            raise TieraxError(
                f"{where} {self} does not fit {cfg.name}: {'; '.join(problems)}; {fix}"
            )
        self._check_fsdp(cfg, where, config_keys)

    def _check_fsdp(self, cfg, where: str, config_keys: bool = False) -> None:
        """Refuse an FSDP group (:data:`FSDP_AXES`) that does not divide d_model: every weight has
        that dimension, and the sharding rules leave a weight whole on each device when none of its
        dimensions divides, so most parameters, gradients and AdamW moments would be replicated."""
        group = math.prod(getattr(self, a) for a in FSDP_AXES)
        d = getattr(cfg, "d_model", 0)
        if group == 1 or not d or d % group == 0:
            return
        fits = [
            g for g in range(1, self.fsdp + 1) if self.fsdp % g == 0 and d % (g * self.expert) == 0
        ]
        if fits:  # the largest FSDP size that divides, the rest of fsdp's devices on data
            works = MeshShape(self.data * self.fsdp // fits[-1], fits[-1], self.tensor, self.expert)
            example = (  # a train config's keys, or the CLI's option
                " ".join(
                    f"mesh.{a}={getattr(works, a)}"
                    for a in AXES
                    if getattr(works, a) > 1 or getattr(works, a) != getattr(self, a)
                )
                if config_keys
                else f"--mesh {works}"
            )
            fix = f"put the other devices on data, e.g. {example}"
        else:
            fix = "choose sizes whose product divides it"
        raise TieraxError(
            f"{where} {self} does not fit {cfg.name}: FSDP shards weights over "
            f"{'×'.join(FSDP_AXES)} = {group}, which does not divide d_model={d}, so the weights "
            f"would stay whole on every device; {fix}"
        )

    def check_batch(self, global_batch: int, *, where: str = "batch") -> None:
        """Refuse a global batch that the batch axes (:data:`BATCH_AXES`) do not divide."""
        ways = self.batch_ways
        if global_batch % ways:
            raise TieraxError(
                f"{where} {global_batch} is not divisible by {'×'.join(BATCH_AXES)} = {ways} (mesh "
                f"{self}); use a multiple of {ways}"
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


def mesh_shape_of(mesh) -> MeshShape:
    """The :class:`MeshShape` of a :class:`jax.sharding.Mesh` built by :meth:`MeshShape.make`."""
    return MeshShape(**{a: int(mesh.shape[a]) for a in AXES})


def spec(mesh, *dims):
    """A PartitionSpec over ``mesh`` with axes of size 1 left out (so 1-way axes never show).

    Each entry of ``dims`` is None, an axis name, or a tuple of axis names.
    """
    from jax.sharding import PartitionSpec

    def keep(d):
        if d is None:
            return None
        names = tuple(a for a in ((d,) if isinstance(d, str) else d) if mesh.shape[a] > 1)
        if not names:
            return None
        return names[0] if len(names) == 1 else names

    return PartitionSpec(*(keep(d) for d in dims))


def constrain(x, mesh, *dims):
    """``with_sharding_constraint(x, spec(mesh, *dims))``; a no-op without a mesh or on one device.

    Used inside the models where GSPMD would otherwise guess an activation's layout
    (batch over :data:`BATCH_AXES`, heads over ``tensor``).
    """
    if mesh is None or mesh.size == 1:
        return x
    import jax
    from jax.sharding import NamedSharding

    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec(mesh, *dims)))


def make_mesh(data: int = 1, fsdp: int = 1, devices=None, *, tensor: int = 1, expert: int = 1):
    """Shorthand for ``MeshShape(data, fsdp, tensor, expert).make(devices)``."""
    return MeshShape(data, fsdp, tensor, expert).make(devices)


def parse_mesh(
    text: str | None, devices: int | None = None, *, option: str = "--mesh"
) -> MeshShape:
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
                f"{option} {text!r}: expected comma-separated axis=N with axes {', '.join(AXES)} "
                "and N ≥ 1, e.g. fsdp=16,expert=8"
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
