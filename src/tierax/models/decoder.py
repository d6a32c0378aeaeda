"""The decoder skeleton shared by every model family.

Layers are stacked per layer group (``nnx.vmap`` at construction) and executed
with one ``lax.scan`` per group, the layer body wrapped in ``jax.checkpoint``
with the group's policy.  Only scanned layers let a remat policy change the
compiled memory, and the tags are inside the rematted body, so a policy sees them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tierax.models import layers as L
from tierax.models.documents import DocumentMask, document_mask
from tierax.models.prefetch import Part, Prefetch, prefetch_scan, segmented_scan

LayerFactory = Callable[[Any, nnx.Rngs], nnx.Module]


def _stack(factory: LayerFactory, cfg, n: int, rngs: nnx.Rngs) -> nnx.Module:
    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(r: nnx.Rngs) -> nnx.Module:
        return factory(cfg, r)

    return make(rngs)


def segment_scope(group: str, start: int, stop: int) -> str:
    """A segment's scan scope: XLA's op_name metadata keeps [A-Za-z0-9_-] (``@`` is dropped), so the
    segment ``decoder@0-23`` runs under ``tierax_group_decoder__0_23``."""
    return f"{group}__{start}_{stop - 1}"


@dataclass(frozen=True)
class Segments:
    """A layer group run as consecutive scans, one per :class:`~tierax.models.prefetch.Part`, in
    layer order."""

    parts: tuple[Part, ...]


def _run_scan(
    x_BSD,
    graphdef,
    state,
    policy,
    mesh,
    scope: str,
    doc: DocumentMask | None = None,
    unroll: int = 1,
):
    """``state``'s stacked layers applied to ``x_BSD`` by one scan under ``policy``, ``unroll``
    layers per trip (the policy path; tierax's prefetching scan runs one)."""

    def body(carry, layer_state):
        return nnx.merge(graphdef, layer_state)(carry, mesh, doc), None

    # The scope lets an abstract trace, and the compile report, attribute values to a group or
    # segment.
    with jax.named_scope(f"tierax_group_{scope}"):
        if isinstance(policy, Prefetch):
            _unrolled_refused(unroll, "the prefetching scan (mechanism: prefetch)")
            layer = lambda x, s: nnx.merge(graphdef, s)(x, mesh, doc)  # noqa: E731
            return prefetch_scan(layer, policy.keep, policy.offload)(x_BSD, state)
        if policy is not None:
            body = jax.checkpoint(body, policy=policy, prevent_cse=single_trip(state, unroll))
        return jax.lax.scan(body, x_BSD, state, unroll=unroll)[0]


def single_trip(state, unroll: int) -> bool:
    """Whether a scan over ``state``'s stacked layers, ``unroll`` layers per trip, makes one trip.
    XLA removes a one-trip loop, which leaves the layers' forward and the backward's recomputation
    side by side in one computation: without ``prevent_cse`` XLA:TPU merges the two and keeps the
    forward's values, so a policy's remat becomes save-all (tests/test_one_trip_remat.py).  In a
    scan of more trips the loop keeps them apart, and ``prevent_cse``'s barriers would only cost."""
    return jax.tree.leaves(state)[0].shape[0] <= unroll


def _unrolled_refused(unroll: int, what: str) -> None:
    if unroll != 1:
        from tierax.errors import TieraxError

        raise TieraxError(
            f"scan_unroll={unroll}: {what} runs one layer per trip; use scan_unroll=1 or a plan "
            "with the policy mechanism and no segments"
        )


class Decoder(nnx.Module):
    """Token embedding → scanned layer groups → RMSNorm → LM head.

    Args:
      cfg: the model config (``LlamaConfig`` or ``DeepSeekConfig``).
      factories: one layer factory per layer group name of ``cfg.layer_groups()``.
      rngs: parameter RNG streams.
    """

    def __init__(self, cfg, factories: Mapping[str, LayerFactory], *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.group_names = tuple(g.name for g in cfg.layer_groups())
        self.embed = nnx.Embed(
            cfg.vocab_size,
            cfg.d_model,
            dtype=jnp.dtype(cfg.dtype),
            param_dtype=jnp.dtype(cfg.param_dtype),
            embedding_init=nnx.initializers.normal(stddev=1.0),
            rngs=rngs,
        )
        self.groups = nnx.Dict(
            {g.name: _stack(factories[g.name], cfg, g.num_layers, rngs) for g in cfg.layer_groups()}
        )
        self.final_norm = L.RMSNorm(cfg.d_model, cfg, rngs=rngs)
        self.head = None if cfg.tie_embeddings else L.dense(
            cfg.d_model, cfg.vocab_size, cfg, rngs, quantize=False
        )

    def __call__(
        self,
        tokens_BS,
        policies: Mapping[str, Callable | None] | None = None,
        mesh=None,
        segment_ids=None,
    ):
        """Logits (float32) for ``tokens_BS`` (materialised in full: the loss uses :meth:`hidden`).

        Args:
          tokens_BS: int token ids.
          policies: layer group → ``jax.checkpoint`` policy, or None for no
            rematerialisation of that group.  Build it with
            :func:`tierax.plan.to_policies`; nothing else should.
          mesh: the :class:`jax.sharding.Mesh` the step runs on (None: one device).
          segment_ids: [B, S] ids of packed documents (see :meth:`hidden`).
        """
        x_BSD = self.hidden(tokens_BS, policies, mesh, segment_ids)
        if self.head is None:
            logits = self.embed.attend(x_BSD)
        else:
            logits = self.head(x_BSD)
        return logits.astype(jnp.float32)

    def hidden(
        self,
        tokens_BS,
        policies: Mapping[str, Callable | None] | None = None,
        mesh=None,
        segment_ids=None,
    ):
        """Final hidden states (after the final RMSNorm), [B, S, D] in the compute dtype.

        Logits are ``hidden @ output_weight()``; :mod:`tierax.models.loss` computes the
        loss from these in tiles, never holding the full [tokens, vocab] logits.
        ``segment_ids`` [B, S] (None: one document per row): packed documents, each
        attending only to itself, positions restarting at its start
        (:mod:`tierax.models.documents`).
        """
        policies = policies or {}
        doc = None if segment_ids is None else document_mask(segment_ids)
        x_BSD = L._replicated(self.embed(tokens_BS), mesh)
        for name in self.group_names:
            graphdef, state = nnx.split(self.groups[name])
            policy = policies.get(name)
            if not isinstance(policy, Segments):
                x_BSD = _run_scan(
                    x_BSD, graphdef, state, policy, mesh, name, doc, self.cfg.scan_unroll
                )
                continue

            _unrolled_refused(self.cfg.scan_unroll, "a segmented layer group")

            def layer(x, s, graphdef=graphdef):
                return nnx.merge(graphdef, s)(x, mesh, doc)

            scopes = [segment_scope(name, q.start, q.stop) for q in policy.parts]
            x_BSD = segmented_scan(layer, policy.parts, scopes)(x_BSD, state)
        return self.final_norm(x_BSD)

    def moe_dropped(self, tokens_BS, batch_shards: int = 1):
        """Per MoE layer (in order), the (token, choice) assignments its capacity drops for this
        batch.

        ``batch_shards``: how many device batches the batch is split into (data × fsdp ×
        expert on the step's mesh): capacity is per device batch, as in the step.  Runs the
        layers one by one (unscanned, no remat): a diagnostic, not the training path.
        """
        from tierax.models import moe as moe_lib

        x_BSD = self.embed(tokens_BS)
        out = []
        for name in self.group_names:
            graphdef, state = nnx.split(self.groups[name])
            for i in range(jax.tree.leaves(state)[0].shape[0]):
                layer = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))
                if isinstance(layer.mlp, L.MoE):
                    h_BSD = x_BSD + layer.attention(layer.attn_norm(x_BSD))
                    out.append(
                        moe_lib.dropped_in_batch(
                            layer.mlp_norm(h_BSD), layer.mlp.router[...], self.cfg, batch_shards
                        )
                    )
                x_BSD = layer(x_BSD)
        return jnp.stack(out) if out else jnp.zeros((0,), jnp.int32)

    def output_weight(self):
        """The LM head as a [D, V] matrix in the compute dtype (the tied embedding transposed)."""
        dt = jnp.dtype(self.cfg.dtype)
        if self.head is None:
            return self.embed.embedding[...].astype(dt).T
        return self.head.kernel[...].astype(dt)
