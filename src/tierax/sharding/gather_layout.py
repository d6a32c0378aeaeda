"""Which stacked weights XLA:GPU all-gathers through a transposed copy of the whole stack.

XLA:GPU gathers along an array's major dimension.  Inside a scanned group the step slices one
layer out of each stacked weight and all-gathers it over the FSDP axes; when that layer slice
has a dimension of more than one element before the sharded one, layout assignment gives the
loop's operand a layout with the sharded dimension major, and the change is made once, before
the forward loop, on the whole stack (parameter dtype, sharded as stored).  The copy lives until
the backward loop ends.  Seen as the ``wrapped_transpose`` buffers of deviceless compiles, one
per stack this module names: llama3.1-405b fsdp=128 (``wi_0``, ``wi_1``), fsdp=16 × tensor=8
(``mlp/wo``, ``attention/wo``), fsdp=1024; DeepSeek-V3 61 layers fsdp=16 × expert=8 (the routed
experts' ``wi_0``/``wi_1``/``wo``, ``wq_b``, ``wkv_b``, the dense ``wi_0``/``wi_1``, the shared
expert's ``wo``: all ten).
"""

from __future__ import annotations

import math

import jax

from tierax.sharding import rules as sh


def _spec_axes(path, shape: tuple[int, ...], mesh: dict) -> list[tuple[str, ...]]:
    """The mesh axes each dimension of a parameter is sharded over (:mod:`tierax.sharding.rules`'s
    rules)."""
    spec = tuple(sh.param_spec(path, shape, mesh)) + (None,) * len(shape)
    return [(e,) if isinstance(e, str) else tuple(e or ()) for e in spec[: len(shape)]]


def needs_transposed_copy(path, shape: tuple[int, ...], mesh: dict) -> bool:
    """Whether the stacked weight at ``path`` (layer dimension first) is gathered through a
    transposed copy.

    The gathered dimension is the one sharded over ``fsdp`` (or ``expert``, which also shards
    non-expert weights); a routed expert weight's expert dimension stays sharded (expert
    parallelism).
    """
    keys = [str(k.key) for k in path if hasattr(k, "key")]
    expert_weight = bool(keys) and keys[-1] in sh.EXPERT_WEIGHTS and len(shape) == 4
    gathered = {"fsdp"} if expert_weight else {"fsdp", "expert"}
    before = []
    for d, axes in enumerate(_spec_axes(path, shape, mesh)):
        if d == 0:
            continue  # the layer dimension: sliced by the loop, never sharded
        if gathered & set(axes):
            return any(n > 1 for n in before)
        before.append(shape[d] // math.prod(mesh.get(a, 1) for a in axes))
    return False


def transposed_params(params, mesh: dict) -> float:
    """Per-device parameters of the stacked weights in ``params`` (an abstract parameter tree, its
    layer groups under ``groups``) that are gathered through a transposed copy."""
    total = 0.0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        shape = tuple(leaf.shape)
        keys = [str(k.key) for k in path if hasattr(k, "key")]
        if "groups" in keys and len(shape) >= 3 and needs_transposed_copy(path, shape, mesh):
            total += math.prod(
                n // math.prod(mesh.get(a, 1) for a in axes)
                for n, axes in zip(shape, _spec_axes(path, shape, mesh), strict=False)
            )
    return total
