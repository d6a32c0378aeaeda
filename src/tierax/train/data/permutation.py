"""A keyed pseudo-random permutation of ``range(n)``, computed per index in O(1) memory.

A four-round Feistel network over the smallest even number of bits that covers ``n``, with
cycle walking to stay below ``n`` (Black & Rogaway 2002): a bijection of ``range(n)`` for
every key, evaluated for a whole array of indices at once.  An epoch's order over billions
of windows then costs nothing to hold, and any row of any step is found directly.
"""

from __future__ import annotations

import numpy as np

_ROUNDS = 4
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64's finaliser: every input bit affects every output bit.
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def round_keys(entropy: list[int]) -> np.ndarray:
    """Four 64-bit round keys from a seed list (``numpy.random.SeedSequence``)."""
    return np.random.SeedSequence(entropy).generate_state(_ROUNDS, np.uint64)


def permute(index: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """The images of ``index`` (values in ``range(n)``) under the permutation keyed by ``keys``."""
    if n <= 1:
        return np.zeros_like(np.asarray(index, np.int64))
    half = max(1, (int(n - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    shift = np.uint64(half)

    def feistel(x: np.ndarray) -> np.ndarray:
        left, right = x >> shift, x & mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        return (left << shift) | right

    x = np.asarray(index, np.uint64).copy()
    with np.errstate(over="ignore"):
        x = feistel(x)
        out = x >= np.uint64(n)
        while out.any():  # cycle walking: at most a few rounds, the domain is < 4n
            x[out] = feistel(x[out])
            out = x >= np.uint64(n)
    return x.astype(np.int64)
