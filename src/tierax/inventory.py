"""Activation inventory from an abstract trace (``jax.make_jaxpr``; nothing is allocated).

For every layer group and activation name: bytes per layer, number of layers.
Works on any loss function whose layers use ``checkpoint_name``; layer groups
are recognised by the ``tierax_group_<name>`` name scope the reference models
put around each scan (elsewhere a value's group is ``<top>``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import jax

from tierax import jaxpr_tools
from tierax import plan as plan_lib


@dataclass(frozen=True)
class Activation:
    group: str
    name: str
    bytes_per_layer: int
    num_layers: int

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_layer * self.num_layers


def trace_inventory(fn: Callable, *args) -> list[Activation]:
    """Inventory of ``fn(*args)``; args may be ShapeDtypeStructs."""
    jaxpr = jax.make_jaxpr(fn)(*args)
    per_layer: dict[tuple[str, str], int] = defaultdict(int)
    layers: dict[tuple[str, str], int] = {}
    for v in jaxpr_tools.named_values(jaxpr):
        key = (v.group, v.name)
        per_layer[key] += v.nbytes
        layers[key] = v.count
    return [Activation(g, n, per_layer[(g, n)], layers[(g, n)]) for (g, n) in per_layer]


def model_inventory(cfg, batch: int, seq: int) -> list[Activation]:
    """Inventory of a reference model's forward pass at (batch, seq), traced abstractly."""
    from flax import nnx

    from tierax.models import abstract_model

    graphdef, params = nnx.split(abstract_model(cfg))
    tokens = jax.ShapeDtypeStruct((batch, seq), jax.numpy.int32)
    return trace_inventory(lambda p, t: nnx.merge(graphdef, p)(t), params, tokens)


def bytes_by_placement(inventory: list[Activation], plan: plan_lib.Plan, cfg) -> dict[str, int]:
    """Total named-activation bytes per placement (device / offload / remat) under ``plan``."""
    placements = plan_lib.resolve(plan, cfg)
    out = {p.value: 0 for p in plan_lib.Placement}
    for a in inventory:
        if a.group in placements and a.name in placements[a.group]:
            out[placements[a.group][a.name].value] += a.total_bytes
    return out
