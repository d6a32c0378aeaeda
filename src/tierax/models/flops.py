"""Analytic training FLOPs per step.

Convention (MaxText's, used for TFLOP/s/device and MFU everywhere in tierax):

    flops = 6 · (weights each token multiplies by) · tokens
          + 3 · attention_forward

where the weights include every attention and MLP projection, the MoE router,
only the *activated* experts (top-k routed + shared), and the LM head, but not the
embedding lookup; and the attention forward is the two score/context matmuls,
``2·B·S²·H·(d_qk + d_v)``, halved for a causal mask (``causal=True``).  The 3×
counts forward + backward (two matmuls per forward matmul).  Recomputation
under a remat plan is *not* counted: this is the model's work, the same for
every plan, so MFU compares plans fairly.
"""

from __future__ import annotations


def attention_forward_flops(cfg, batch: int, seq: int, *, causal: bool = True) -> float:
    heads, dqk, dv = cfg.attention_dims()
    full = 2.0 * batch * seq * seq * heads * (dqk + dv) * cfg.num_layers
    return full / 2 if causal else full


def train_flops(cfg, batch: int, seq: int, *, causal: bool = True) -> float:
    """Training FLOPs of one step of ``batch`` sequences of length ``seq``."""
    tokens = batch * seq
    return 6.0 * cfg.matmul_params_per_token() * tokens + 3.0 * attention_forward_flops(
        cfg, batch, seq, causal=causal
    )
