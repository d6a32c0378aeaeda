"""Llama-style decoder (Llama 3; Mixtral with experts): GQA + RoPE + SwiGLU or a mixture of SwiGLU
experts, one scanned layer group."""

from __future__ import annotations

from flax import nnx

from tierax.models import layers as L
from tierax.models.config import LlamaConfig
from tierax.models.decoder import Decoder


def decoder_layer(cfg: LlamaConfig, rngs: nnx.Rngs) -> nnx.Module:
    mlp = (
        L.MoE(cfg, rngs=rngs)
        if cfg.num_experts
        else L.SwiGLU(cfg.d_model, cfg.mlp_dim, cfg, rngs=rngs)
    )
    return L.DecoderLayer(L.GQAttention(cfg, rngs=rngs), mlp, cfg, rngs=rngs)


def build(cfg: LlamaConfig, rngs: nnx.Rngs) -> Decoder:
    return Decoder(cfg, {"decoder": decoder_layer}, rngs=rngs)
