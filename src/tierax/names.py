"""The closed set of activation names shared by models, plans and docs.

Every tensor a reference model tags with ``jax.ad_checkpoint.checkpoint_name``
uses one of these constants, and a Plan for one of tierax's models may only mention
these names (``tierax.plan.resolve`` checks a plan against the model's).  A model
planned through :mod:`tierax.api` tags its own names, which its plans carry; MaxText
overrides carry MaxText's keys only.  The spelling follows MaxText so that plans
translate between the two projects.
"""

from __future__ import annotations

# Layer boundary (the scan carry as seen inside the rematted layer body).
DECODER_LAYER_INPUT = "decoder_layer_input"

# Attention (both the GQA and the MLA decoders).
QUERY_PROJ = "query_proj"  # queries after RoPE, [b, s, heads, qk_dim]
KEY_PROJ = "key_proj"  # keys after RoPE, [b, s, kv_heads, qk_dim]
VALUE_PROJ = "value_proj"  # values, [b, s, kv_heads, v_dim]
ATTENTION_OUT = "attention_out"  # attention context before the output projection
OUT_PROJ = "out_proj"  # output projection, [b, s, d_model]

# Multi-head latent attention (DeepSeek-V2/V3).
QUERY_WA_PROJ = "query_wa_proj"  # low-rank query down-projection, before its norm
MLA_Q = "mla_q"  # normalised low-rank query
KV_WA_PROJ = "kv_wa_proj"  # low-rank key/value down-projection incl. the RoPE key part
MLA_KV = "mla_kv"  # normalised low-rank key/value latent

# Dense SwiGLU MLP (also the shared expert of an MoE layer).
MLPWI_0 = "mlpwi_0"  # gate projection
MLPWI_1 = "mlpwi_1"  # up projection
MLPWO = "mlpwo"  # down projection

# Routed experts.
MOE_MLPWI_0 = "moe_mlpwi_0"
MOE_MLPWI_1 = "moe_mlpwi_1"
MOE_MLPWO = "moe_mlpwo"

ALL_NAMES: tuple[str, ...] = (
    DECODER_LAYER_INPUT,
    QUERY_WA_PROJ,
    MLA_Q,
    KV_WA_PROJ,
    MLA_KV,
    QUERY_PROJ,
    KEY_PROJ,
    VALUE_PROJ,
    ATTENTION_OUT,
    OUT_PROJ,
    MLPWI_0,
    MLPWI_1,
    MLPWO,
    MOE_MLPWI_0,
    MOE_MLPWI_1,
    MOE_MLPWO,
)

GQA_ATTENTION_NAMES = (QUERY_PROJ, KEY_PROJ, VALUE_PROJ, ATTENTION_OUT, OUT_PROJ)
MLA_ATTENTION_NAMES = (QUERY_WA_PROJ, MLA_Q, KV_WA_PROJ, MLA_KV) + GQA_ATTENTION_NAMES
MLP_NAMES = (MLPWI_0, MLPWI_1, MLPWO)
MOE_NAMES = (MOE_MLPWI_0, MOE_MLPWI_1, MOE_MLPWO)

# Outputs of a matmul with a weight (what MaxText's "minimal" keeps).
PROJECTION_NAMES = frozenset(
    {QUERY_WA_PROJ, KV_WA_PROJ, QUERY_PROJ, KEY_PROJ, VALUE_PROJ, OUT_PROJ}
    | set(MLP_NAMES)
    | set(MOE_NAMES)
)

# The values a layer makes before its attention (the projections and, for MLA, the low-rank
# latents): an offloading scan stores them in their own layer, where the attention and the MLP
# follow them (tierax.models.prefetch); it stores any other value while the next layer computes.
BEFORE_ATTENTION = frozenset(
    {QUERY_PROJ, KEY_PROJ, VALUE_PROJ, QUERY_WA_PROJ, MLA_Q, KV_WA_PROJ, MLA_KV}
)
