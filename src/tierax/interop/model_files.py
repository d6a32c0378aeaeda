"""Model configs written for other tools, read as tierax ModelConfigs.

* A **MaxText model YAML** (``configs/models/*.yml``: ``base_emb_dim``,
  ``base_num_decoder_layers``, ``decoder_block``, …) with ``decoder_block`` ``llama2``
  (→ family llama) or ``deepseek`` (→ family deepseek, MLA + MoE), as one of tierax's own models.
  Keys absent take MaxText's ``base.yml`` default.  A file tierax's models cannot express is
  refused with the pointer to ``--maxtext FILE``, which traces MaxText's own program instead.
* A **Hugging Face ``config.json``** of ``LlamaForCausalLM`` or ``DeepseekV3ForCausalLM``.

Every key is either modelled (mapped onto a field), required to have the value
tierax models (e.g. ``hidden_act: silu``), accepted as *not modelled* — it changes
neither memory nor FLOPs of a training step (RoPE scaling details, routing-group
limits, token ids) or describes inference only — and listed on stderr, or refused
(exit 2) naming it.  Imported configs use ``attention: auto`` — cuDNN's fused flash
attention for a GPU target, blockwise (flash-style) elsewhere — as MaxText and Hugging
Face training on GPUs use fused attention that never holds the full score matrix.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Mapping
from typing import Any

from tierax import schema
from tierax.errors import TieraxError
from tierax.interop.maxtext_keys import quantization_from_maxtext
from tierax.models.config import AUTO_ATTENTION, DeepSeekConfig, LlamaConfig

MAXTEXT_BLOCKS = {"llama2": "llama", "deepseek": "deepseek"}
HF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "DeepseekV3ForCausalLM": "deepseek"}
HF_MODEL_TYPES = {"llama": "LlamaForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}
HF_ROPE_THETA = 10_000.0  # transformers' LlamaConfig and DeepseekV3Config default
_DTYPES = {
    "bfloat16": "bfloat16",
    "float32": "float32",
    "float16": "float16",
    "fp32": "float32",
    "bf16": "bfloat16",
}

# --- MaxText --------------------------------------------------------------------------------------
# MaxText key → tierax field, per family; defaults are base.yml's.
_MT_COMMON = {
    "base_emb_dim": "d_model",
    "base_num_query_heads": "num_heads",
    "base_num_decoder_layers": "num_layers",
    "vocab_size": "vocab_size",
    "normalization_layer_epsilon": "norm_eps",
    "rope_max_timescale": "rope_theta",
    "logits_via_embedding": "tie_embeddings",
    "dtype": "dtype",
    "weight_dtype": "param_dtype",
    "mu_dtype": "mu_dtype",
    "num_vocab_tiling": "loss_tiles",
    "quantization": "quantization",
}
_MT_DEFAULTS = {
    "normalization_layer_epsilon": 1e-5,
    "rope_max_timescale": 10_000.0,
    "logits_via_embedding": False,
    "dtype": "bfloat16",
    "weight_dtype": "float32",
    "mu_dtype": "",
    "num_vocab_tiling": 1,
    "quantization": "",
    "head_dim": 128,
    "first_num_dense_layers": 0,
    "shared_experts": 0,
    "routed_scaling_factor": 1.0,
}
_MT_FIELDS = {
    "llama": {
        **_MT_COMMON,
        "base_num_kv_heads": "num_kv_heads",
        "head_dim": "head_dim",
        "base_mlp_dim": "mlp_dim",
    },
    "deepseek": {
        **_MT_COMMON,
        "base_mlp_dim": "dense_mlp_dim",
        "base_moe_mlp_dim": "expert_mlp_dim",
        "first_num_dense_layers": "first_dense_layers",
        "num_experts": "num_experts",
        "num_experts_per_tok": "num_experts_per_tok",
        "shared_experts": "num_shared_experts",
        "routed_scaling_factor": "routed_scaling_factor",
        "q_lora_rank": "q_lora_rank",
        "kv_lora_rank": "kv_lora_rank",
        "qk_nope_head_dim": "qk_nope_head_dim",
        "qk_rope_head_dim": "qk_rope_head_dim",
        "v_head_dim": "v_head_dim",
    },
}
_MT_NOT_MODELLED = {
    "rope_type",
    "max_position_embeddings",
    "original_max_position_embeddings",
    "rope_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "rope_interleave",
    "rope_truncate",
    "rope_attention_scaling",
    "routed_score_func",
    "routed_bias",
    "routed_bias_update_rate",
    "n_routing_groups",
    "topk_routing_group",
    "norm_topk_prob",
    "model_name",
    "decoder_block",
    "mlp_activations",
    "enable_dropout",
    "attention_type",
    "base_num_kv_heads",
    "head_dim",
    "capacity_factor",
}


def is_maxtext_model(data: Any) -> bool:
    return isinstance(data, Mapping) and ("decoder_block" in data or "base_emb_dim" in data)


def is_hf_config(data: Any) -> bool:
    # Not conditioned on hidden_size: a config.json without it is reported as such, not as a tierax
    # config missing 'family'.
    return isinstance(data, Mapping) and ("architectures" in data or "model_type" in data)


def _require(cond: bool, source: str, msg: str) -> None:
    if not cond:
        raise TieraxError(f"{source}: {msg}")


def _name_of(path: pathlib.Path) -> str:
    stem = path.stem.removesuffix(".config")
    return path.parent.name if stem == "config" and path.parent.name else stem


def _build(cls, values: dict, source: str, keys: Mapping[str, str]):
    """``cls(**values)``, each value checked against its field's type; ``keys`` maps fields back to
    the file's keys.  A value of the wrong type is named before a key that is missing."""
    import dataclasses

    types = schema.field_types(cls)
    try:
        checked = {k: schema.scalar(keys.get(k, k), v, types[k], source) for k, v in values.items()}
    except TieraxError as e:
        raise TieraxError(e.args[0] if str(e).startswith(source) else f"{source}: {e}") from None
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [keys.get(f, f) for f in required if f not in values]
    _require(
        not missing, source, f"missing key(s) {', '.join(missing)}; a {cls.family} model needs them"
    )
    try:
        return cls(**checked)
    except TieraxError as e:
        raise TieraxError(e.args[0] if str(e).startswith(source) else f"{source}: {e}") from None


def _report(source: str, not_modelled: list[str], notes: list[str]) -> None:
    if not_modelled:
        print(
            f"{source}: not modelled (no effect on training memory or FLOPs here): "
            f"{', '.join(not_modelled)}",
            file=sys.stderr,
        )
    for n in notes:
        print(f"{source}: {n}", file=sys.stderr)


def from_maxtext(data: Mapping, path: pathlib.Path):
    """A MaxText model YAML as a ModelConfig (see the module docstring)."""
    source = str(path)
    block = data.get("decoder_block", "llama2")
    if block not in MAXTEXT_BLOCKS:
        raise TieraxError(
            f"{source}: decoder_block {block!r} is not supported; valid choices: "
            f"{', '.join(MAXTEXT_BLOCKS)} (tierax models the Llama and DeepSeek-V3 decoders)"
        )
    family = MAXTEXT_BLOCKS[block]
    fields = _MT_FIELDS[family]
    unknown = [k for k in data if k not in fields and k not in _MT_NOT_MODELLED]
    _require(
        not unknown,
        source,
        f"unsupported key(s) {', '.join(unknown)}{_typo_hints(unknown, fields, _MT_NOT_MODELLED)}: "
        "they would change memory or FLOPs in ways tierax does not model; remove them or use a "
        "tierax config (`tierax models show NAME`)",
    )
    acts = data.get("mlp_activations", ["silu", "linear"])
    _require(
        list(acts) == ["silu", "linear"],
        source,
        f"mlp_activations {acts!r} is not supported; tierax models SwiGLU: use [silu, linear]",
    )
    _require(
        data.get("enable_dropout", False) is False,
        source,
        "enable_dropout: true is not supported (dropout masks are not modelled); set "
        "enable_dropout: false",
    )
    want_attn = "mla" if family == "deepseek" else "global"
    _require(
        data.get("attention_type", want_attn) == want_attn,
        source,
        f"attention_type {data.get('attention_type')!r} is not supported for decoder_block "
        f"{block}; use {want_attn}",
    )
    notes = [
        f"read as tierax's own {family} model (tierax's step, names and buffers); --maxtext "
        f"{path} plans MaxText's own program as MaxText builds it"
    ]
    if family == "deepseek":
        _require(
            data.get("base_num_kv_heads", data.get("base_num_query_heads"))
            == data.get("base_num_query_heads"),
            source,
            "MLA needs base_num_kv_heads equal to base_num_query_heads",
        )
        cf = data.get("capacity_factor", -1.0)
        if cf is None or cf <= 0:
            notes.append(
                "capacity_factor ≤ 0 (MaxText's dropless default) is modelled as capacity factor "
                "1.0"
            )
    values = {
        field: data.get(key, _MT_DEFAULTS.get(key))
        for key, field in fields.items()
        if key in data or key in _MT_DEFAULTS
    }
    if family == "deepseek" and (data.get("capacity_factor") or 0) > 0:
        values["capacity_factor"] = float(data["capacity_factor"])
    for k in ("dtype", "param_dtype", "mu_dtype"):
        if k in values:
            values[k] = _DTYPES.get(str(values[k]), values[k])
    if "quantization" in values:  # MaxText's te_mxfp8 is tierax's mxfp8
        values["quantization"] = quantization_from_maxtext(str(values["quantization"] or ""))
    cls = LlamaConfig if family == "llama" else DeepSeekConfig
    cfg = _build(
        cls,
        {"name": _name_of(path), "attention": AUTO_ATTENTION, **values},
        source,
        {f: k for k, f in fields.items()},
    )
    not_modelled = [
        k
        for k in data
        if k in _MT_NOT_MODELLED
        and k not in fields
        and k not in ("decoder_block", "mlp_activations", "enable_dropout", "attention_type")
    ]
    if "enable_dropout" not in data:
        notes.append(
            "enable_dropout not set (MaxText's base.yml default is true); tierax models no dropout"
        )
    _report(source, not_modelled, notes)
    return cfg


# --- Hugging Face ---------------------------------------------------------------------------------
_HF_COMMON = {
    "hidden_size": "d_model",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "vocab_size": "vocab_size",
    "rms_norm_eps": "norm_eps",
    "rope_theta": "rope_theta",
    "tie_word_embeddings": "tie_embeddings",
}
_HF_FIELDS = {
    "llama": {
        **_HF_COMMON,
        "num_key_value_heads": "num_kv_heads",
        "head_dim": "head_dim",
        "intermediate_size": "mlp_dim",
    },
    "deepseek": {
        **_HF_COMMON,
        "intermediate_size": "dense_mlp_dim",
        "moe_intermediate_size": "expert_mlp_dim",
        "first_k_dense_replace": "first_dense_layers",
        "n_routed_experts": "num_experts",
        "num_experts_per_tok": "num_experts_per_tok",
        "n_shared_experts": "num_shared_experts",
        "routed_scaling_factor": "routed_scaling_factor",
        "q_lora_rank": "q_lora_rank",
        "kv_lora_rank": "kv_lora_rank",
        "qk_nope_head_dim": "qk_nope_head_dim",
        "qk_rope_head_dim": "qk_rope_head_dim",
        "v_head_dim": "v_head_dim",
    },
}
# Checked for the value tierax models, then accepted.
_HF_REQUIRED = {
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "moe_layer_freq": 1,
}
_HF_NOT_MODELLED = {
    "architectures",
    "model_type",
    "transformers_version",
    "use_cache",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "initializer_range",
    "max_position_embeddings",
    "rope_scaling",
    "pretraining_tp",
    "auto_map",
    "n_group",
    "topk_group",
    "topk_method",
    "scoring_func",
    "norm_topk_prob",
    "ep_size",
    "aux_loss_alpha",
    "seq_aux",
    "num_nextn_predict_layers",
    "quantization_config",
    "num_key_value_heads",
}
_HF_WHY = {
    "num_nextn_predict_layers": "num_nextn_predict_layers (the multi-token-prediction module is "
    "not built; parameter counts exclude it)",
    "quantization_config": "quantization_config (inference weights; training uses param_dtype)",
}


def from_hf(data: Mapping, path: pathlib.Path):
    """A Hugging Face ``config.json`` as a ModelConfig (see the module docstring)."""
    source = str(path)
    archs = data.get("architectures") or []
    if not archs:  # HF's model_type says which class it would load; name it in the fix
        guess = HF_MODEL_TYPES.get(data.get("model_type"), next(iter(HF_ARCHITECTURES)))
        raise TieraxError(
            f'{source}: no \'architectures\' key; add "architectures": ["{guess}"] '
            f"(tierax reads: {', '.join(HF_ARCHITECTURES)})"
        )
    archs = list(archs) if isinstance(archs, list) else [archs]
    known = [a for a in archs if a in HF_ARCHITECTURES]
    _require(
        len(known) == 1,
        source,
        f"architectures {archs!r} are not supported; valid choices: {', '.join(HF_ARCHITECTURES)}",
    )
    family = HF_ARCHITECTURES[known[0]]
    fields = _HF_FIELDS[family]
    unknown = [
        k
        for k in data
        if k not in fields
        and k not in _HF_NOT_MODELLED
        and k not in _HF_REQUIRED
        and k != "torch_dtype"  # modelled: the compute dtype (below)
        and not k.startswith("_")
    ]
    _require(
        not unknown,
        source,
        f"unsupported key(s) {', '.join(unknown)}{_typo_hints(unknown, fields, _HF_NOT_MODELLED)}: "
        "they would change memory or FLOPs in ways tierax does not model, or tierax does not "
        "know them; remove them to proceed",
    )
    for key, want in _HF_REQUIRED.items():
        if key in data:
            _require(
                data[key] == want,
                source,
                f"{key} {data[key]!r} is not supported; tierax models {key}: {want!r}",
            )
    if family == "deepseek" and "q_lora_rank" in data and data["q_lora_rank"] is None:
        raise TieraxError(
            f"{source}: q_lora_rank: null (queries without a low-rank projection, "
            "as in DeepSeek-V2-Lite) is not supported; tierax models MLA with a "
            "low-rank query: give q_lora_rank > 0"
        )
    values = {
        field: data[key] for key, field in fields.items() if key in data and data[key] is not None
    }
    notes = []
    if "rope_theta" not in values:  # HF defaults it, and not to tierax's Llama default (500000)
        values["rope_theta"] = HF_ROPE_THETA
        notes.append(f"rope_theta not set: Hugging Face's default {HF_ROPE_THETA:g} is used")
    heads, hidden = data.get("num_attention_heads"), data.get("hidden_size")
    if family == "llama":
        values.setdefault("num_kv_heads", heads)
        whole = all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (heads, hidden)
        )
        if "head_dim" not in values and whole:  # else the type check below names the bad value
            values["head_dim"] = hidden // heads
    else:
        kv = data.get("num_key_value_heads", heads)
        _require(kv == heads, source, "MLA needs num_key_value_heads equal to num_attention_heads")
    # torch_dtype is modelled: it is the compute dtype (and so the bytes of every activation and
    # which attention kernel `attention: auto` picks); absent, bfloat16 (what training runs in).
    torch_dtype = data.get("torch_dtype", "bfloat16")
    _require(
        str(torch_dtype) in _DTYPES,
        source,
        f"torch_dtype {torch_dtype!r} is not a compute dtype tierax models; use one of: "
        f"{', '.join(sorted(_DTYPES))}",
    )
    dtype = _DTYPES[str(torch_dtype)]
    cls = LlamaConfig if family == "llama" else DeepSeekConfig
    cfg = _build(
        cls,
        {"name": _name_of(path), "attention": AUTO_ATTENTION, "dtype": dtype, **values},
        source,
        {f: k for k, f in fields.items()},
    )
    not_modelled = [
        _HF_WHY.get(k, k)
        for k in data
        if (k in _HF_NOT_MODELLED or k.startswith("_")) and k not in fields
    ]
    _report(source, not_modelled, notes)
    return cfg


def load_foreign(data: Any, path: str | pathlib.Path):
    """The ModelConfig a MaxText model YAML or Hugging Face config describes, or None for a tierax
    config file."""
    path = pathlib.Path(path)
    if isinstance(data, Mapping) and "family" in data:
        return None
    if is_hf_config(data):
        return from_hf(data, path)
    if is_maxtext_model(data):
        try:
            return from_maxtext(data, path)
        except TieraxError as e:
            raise TieraxError(
                f"{e}. To plan MaxText's own program from this file as MaxText builds it (every "
                f"decoder block MaxText ships), give it as --maxtext {path} instead of "
                "--model-config"
            ) from None
    return None


def _typo_hints(unknown, *known) -> str:
    """`` (did you mean 'base_emb_dim' for 'base_emb_dm'?)`` for keys close to ones the format
    has."""
    import difflib

    valid = [str(k) for group in known for k in group]
    hints = [
        f"{close[0]!r} for {k!r}"
        for k in unknown
        if (close := difflib.get_close_matches(str(k), valid, n=1))
    ]
    return f" (did you mean {', '.join(hints)}?)" if hints else ""
