"""XLA:TPU's tiled layouts: the bytes a TPU buffer takes, and the layout of a saved activation's
stack.

XLA:TPU stores an array of rank 2 or more in tiles over its two minor-most dimensions (in its
layout's minor-to-major order, not the shape's): the minor dimension in 128 lanes, the second-minor
in rows of a tile of 8 (``T(8,128)``; a second-minor dimension under 8 gets a smaller tile of the
next power of two, not under the values one 32-bit word packs, ``4 // itemsize``: bf16's
``T(2,128)(2,1)``, float32's ``T(1,128)``).  A buffer's bytes are its major dimensions' product
times both minor dimensions rounded up to the tile, times the item size (:func:`tiled_bytes`).
The same layout holds in device memory and in host memory (an offloaded buffer's ``S(5)``): the
host bytes of an offloaded activation are its tiled bytes, not its logical ones.

Read from XLA:TPU's (libtpu 0.0.52) buffer assignments of MaxText's train step: every tiled value
of rank >= 2 of gpt-oss-20b on v6e x 4 (remat_policy=custom with q/k/v offloaded, 4 and 6 layers),
of MaxText's tiny llama2 block on v5p x 4 (head dim 64, 3 layers, qkv_proj_offloaded and minimal;
emb 256 and 264) and of bench/maxtext_fidelity.py's deepseek2-16b-v5p-full (2 and 3 layers),
gemma3-4b-v6e-minimal (2 and 12), gpt-oss-20b-v5p-full-4L and llama3-8b-v7x-full (--dump-dir) has
exactly this size (tests/test_tpu_tiling.py compiles the tiny one).

Which dimensions are minor is XLA's layout assignment's choice, made from a buffer's producers
and readers; for the stacks of saved activations (:func:`stacked_value_bytes`) these compiles show:

* a [batch, seq, heads, head_dim] value (MaxText's ``query_proj``, ``key_proj``, ``value_proj``)
  is stacked as [layers, batch, heads, seq, head_dim] (layout ``{4,2,3,1,0}``: the layout splash
  attention reads, heads major to seq), on device (kept: the tiny block under ``minimal``) and on
  the host (offloaded: gpt-oss-20b's and the tiny block's): a head dim of 64 takes 128 lanes, twice
  its logical bytes, and a kv-head count under 8 takes no tile rows (seq is the second-minor
  dimension);
* the scan carry [batch, seq, emb] is stacked seq-minor (``{2,3,1,0}``; gpt-oss-20b's emb 2880,
  not a multiple of 128, unpadded at 4 layers under remat_policy=full on v5p), a [batch, seq, mlp]
  value mlp-minor (the tiny block's mlpwi_0/1 under minimal).  A value of any rank but 4 is counted
  at its logical bytes: of the saved values of bench/maxtext_fidelity.py's TPU cases only
  gpt-oss-20b's carry has a dimension a tile would pad, and it is laid out so that none is.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from tierax import names
from tierax.errors import TieraxError

LANES = 128  # a tile's minor extent: XLA:TPU's vector lanes
ROWS = 8  # a tile's second-minor extent at full size (sublanes)
WORD_BYTES = 4  # XLA:TPU packs values narrower than a 32-bit word into one (bf16's "(2,1)")


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def tile_rows(second_minor: int, itemsize: int) -> int:
    """The rows of the tile XLA:TPU gives a buffer whose second-minor dimension is
    ``second_minor`` values of ``itemsize`` bytes: 8, or for a dimension under 8 the next power of
    two, at least the values one 32-bit word packs."""
    if second_minor >= ROWS:
        return ROWS
    packed = max(1, WORD_BYTES // itemsize)
    return min(ROWS, max(packed, 1 << max(0, second_minor - 1).bit_length()))


def tiled_bytes(shape, dtype, minor_to_major=None) -> int:
    """Bytes XLA:TPU's tiled layout gives an array of ``shape`` and ``dtype`` laid out
    ``minor_to_major`` (XLA's layout order, minor first; None: row-major, the last dimension
    minor).

    Raises:
      TieraxError: ``minor_to_major`` is not an order of ``shape``'s dimensions.
    """
    shape = tuple(int(d) for d in shape)
    rank = len(shape)
    order = tuple(range(rank - 1, -1, -1)) if minor_to_major is None else tuple(minor_to_major)
    return tiled_dims_bytes(shape, jnp.dtype(dtype).itemsize, order)


def tiled_dims_bytes(shape, itemsize: int, minor_to_major) -> int:
    """:func:`tiled_bytes` of an array given by its item size (an XLA program's ``bf16[...]``).

    Raises:
      TieraxError: ``minor_to_major`` is not an order of ``shape``'s dimensions.
    """
    shape = tuple(int(d) for d in shape)
    rank = len(shape)
    order = tuple(minor_to_major)
    if sorted(order) != list(range(rank)):
        raise TieraxError(
            f"layout {order} is no minor-to-major order of the {rank} dimensions of {shape}; give "
            f"each of 0..{rank - 1} once, the minor dimension first"
        )
    if rank < 2:  # a vector: not tiled in rows and lanes; counted at its logical bytes
        return math.prod(shape) * itemsize
    minor, second = shape[order[0]], shape[order[1]]
    major = math.prod(shape[i] for i in order[2:])
    rows = tile_rows(second, itemsize)
    return major * _round_up(second, rows) * _round_up(minor, LANES) * itemsize


def host_stacked_value_bytes(
    name: str, shape, dtype, *, microbatch: int, value_padded: bool = False
) -> int:
    """Bytes per layer that an offloaded activation ``name`` of ``shape`` and ``dtype`` takes in
    its host stack on a TPU, tierax's own models under splash attention: as on device
    (:func:`stacked_value_bytes`), except the values (``value_proj``) at a microbatch of 2 or more,
    which XLA:TPU (libtpu 0.0.52) stores seq-minor, head_dim second-minor (layout ``{2,4,3,1,0}``
    of the [layers, batch, seq, heads, head_dim] stack), so a head dim of 64 takes no padding; at
    microbatch 1, kept on device, and where the layer zero-pads the values to the query/key head
    dim for the kernel (``value_padded``: MLA), head_dim-minor (tests/test_splash_tiling.py
    compiles each)."""
    shape = tuple(int(d) for d in shape)
    if name == names.VALUE_PROJ and microbatch >= 2 and not value_padded and len(shape) == 4:
        # [batch, seq, heads, head_dim]: minor to major 1 3 2 0
        return tiled_bytes(shape, dtype, (1, 3, 2, 0))
    return stacked_value_bytes(shape, dtype)


def stacked_value_bytes(shape, dtype) -> int:
    """Bytes per layer that one saved activation of ``shape`` (per layer, per device) and ``dtype``
    takes in its layer stack on a TPU, on device or host (see the module docstring): a
    [batch, seq, heads, head_dim] value seq second-minor and head_dim minor; a value of any other
    rank at its logical bytes."""
    shape = tuple(int(d) for d in shape)
    if len(shape) != 4:
        return math.prod(shape) * jnp.dtype(dtype).itemsize
    # [batch, seq, heads, head_dim] laid out [batch, heads, seq, head_dim]: minor to major 3 1 2 0
    return tiled_bytes(shape, dtype, (3, 1, 2, 0))
