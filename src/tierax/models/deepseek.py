"""DeepSeek-V3-style decoder: MLA in every layer; dense MLP in the first layers, MoE after.

The dense and MoE layers are two layer groups (two scans), so a plan can place
their activations differently.
"""

from __future__ import annotations

from flax import nnx

from tierax.models import layers as L
from tierax.models.config import DeepSeekConfig
from tierax.models.decoder import Decoder


def dense_layer(cfg: DeepSeekConfig, rngs: nnx.Rngs) -> nnx.Module:
    return L.DecoderLayer(
        L.MLAttention(cfg, rngs=rngs),
        L.SwiGLU(cfg.d_model, cfg.dense_mlp_dim, cfg, rngs=rngs),
        cfg,
        rngs=rngs,
    )


def moe_layer(cfg: DeepSeekConfig, rngs: nnx.Rngs) -> nnx.Module:
    return L.DecoderLayer(L.MLAttention(cfg, rngs=rngs), L.MoE(cfg, rngs=rngs), cfg, rngs=rngs)


def build(cfg: DeepSeekConfig, rngs: nnx.Rngs) -> Decoder:
    return Decoder(cfg, {"dense": dense_layer, "moe": moe_layer}, rngs=rngs)
