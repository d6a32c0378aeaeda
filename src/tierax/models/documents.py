"""Packed documents in one sequence: segment ids, the positions that restart at each document,
and which next-token targets stay inside a document.

A packed row holds several documents end to end; ``segment_ids`` [B, S] numbers them (equal
ids = same document, in runs).  Attention then masks across documents
(:func:`tierax.models.attention.causal_attention`), RoPE uses :attr:`DocumentMask.positions`,
and the loss counts a target only when it is in the same document as its input.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class DocumentMask(NamedTuple):
    """The per-token document structure a decoder layer needs."""

    segment_ids: jax.Array  # [B, S] int32
    positions: jax.Array  # [B, S] int32: offset from the start of the token's document piece


def document_mask(segment_ids_BS: jax.Array) -> DocumentMask:
    """Segment ids → (segment ids, positions restarting at 0 at each document start)."""
    seg = segment_ids_BS.astype(jnp.int32)
    idx = jnp.broadcast_to(jnp.arange(seg.shape[1], dtype=jnp.int32), seg.shape)
    starts = jnp.concatenate([jnp.ones_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], axis=1)
    first = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return DocumentMask(seg, idx - first)


def target_weights(segments_BT: jax.Array) -> jax.Array:
    """[B, T − 1] float32: 1 where input ``t`` and target ``t + 1`` are in one document, else 0."""
    return (segments_BT[:, :-1] == segments_BT[:, 1:]).astype(jnp.float32)
