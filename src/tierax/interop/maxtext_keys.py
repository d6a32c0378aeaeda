"""MaxText's ``remat_policy: custom`` keys and model keys, and an override file read back as a plan
(refused when its model keys describe another model than the one it is read for).

The keys and their values (``remat | device | offload``) are MaxText's, from
``src/maxtext/configs/base.yml`` (AI-Hypercomputer/maxtext, tag maxtext-v0.2.4 and
main at e591f30cb, identical lists) and ``RematAndOffload`` in ``configs/types.py``.
MaxText sets each key once for every layer; tierax's activation names
(:mod:`tierax.names`) are a subset of these keys with the same meaning.

It returns the plan's dict form, which ``Plan.from_dict`` reads
(:func:`tierax.interop.files.load_plan` does).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from tierax import names as N
from tierax.errors import TieraxError

# tierax's quantization → MaxText's ``quantization`` value (``QuantizationType`` in MaxText's
# configs/types.py): "fp8" is MaxText's own name; MXFP8 is ``te_mxfp8``, Transformer Engine's
# ``MXFP8BlockScaling`` recipe (32-element blocks, e8m0 scales, e4m3 for every tensor: the format
# tierax.models.mxfp8 runs).  Values not listed are written as they are.
MAXTEXT_QUANTIZATION: dict[str, str] = {"mxfp8": "te_mxfp8"}
QUANTIZATION_FROM_MAXTEXT: dict[str, str] = {v: k for k, v in MAXTEXT_QUANTIZATION.items()}


def maxtext_quantization(value: str) -> str:
    """MaxText's ``quantization`` value for tierax's."""
    return MAXTEXT_QUANTIZATION.get(value, value)


def quantization_from_maxtext(value: str) -> str:
    """tierax's ``quantization`` value for MaxText's (``te_mxfp8`` → ``mxfp8``)."""
    return QUANTIZATION_FROM_MAXTEXT.get(value, value)


# base.yml, the block after "If "custom" remat_policy is chosen", in its order.
REMAT_KEYS: tuple[str, ...] = (
    "decoder_layer_input",
    "indexer_cutoff_threshold",
    "context",
    "mlpwi",
    "mlpwi_0",
    "mlpwi_1",
    "mlpwo",
    "moe_mlpwi_0",
    "moe_mlpwi_1",
    "moe_mlpwo",
    "query_proj",
    "key_proj",
    "value_proj",
    "kv_proj",
    "qkv_proj",
    "out_proj",
    "query_wa_proj",
    "kv_wa_proj",
    "mla_q",
    "mla_kv",
    "attention_out",
    "engram",
)
# Also in the MaxText 0.2.5 release's base.yml (not in 0.2.4's or main's, whose configs refuse
# unknown keys):
# read when present, never written.
RELEASE_0_2_5_KEYS: tuple[str, ...] = ("moe_x_sorted", "moe_routing_maps")
READ_KEYS = REMAT_KEYS + RELEASE_0_2_5_KEYS
VALUES = ("remat", "device", "offload")
# MaxText's default for a key the file leaves out (base.yml): the layer input stays on device.
DEFAULTS = {k: "device" if k == "decoder_layer_input" else "remat" for k in READ_KEYS}

# MaxText keys with no tierax activation: what they are, and why tierax leaves them at remat.
NO_COUNTERPART: dict[str, str] = {
    "context": "the fused attention kernel's saved output and log-sum-exp, which MaxText names on "
    "TPU (splash attention) and GPU (cuDNN / Transformer Engine flash attention); with hardware: "
    "cpu (dot-product attention) nothing carries the name",
    "mlpwi": "the fused gate+up projection (fused_mlp: true); tierax's MLP is unfused: mlpwi_0, "
    "mlpwi_1",
    "kv_proj": "a unified key/value projection (share_kv_projections); tierax has key_proj and "
    "value_proj",
    "qkv_proj": "the fused q/k/v projection (fused_qkv: true); tierax has query_proj, key_proj, "
    "value_proj",
    "indexer_cutoff_threshold": "the sparse-attention indexer (DeepSeek-V3.2); not in tierax's "
    "models",
    "engram": "Engram memory layers; not in tierax's models",
    "moe_x_sorted": "the expert-sorted MoE input of dropless (ragged) dispatch (MaxText 0.2.5); "
    "tierax models capacity dispatch",
    "moe_routing_maps": "dropless dispatch's routing index maps (MaxText 0.2.5); tierax models "
    "capacity dispatch",
}
assert set(N.ALL_NAMES) <= set(REMAT_KEYS) and set(NO_COUNTERPART) == set(READ_KEYS) - set(
    N.ALL_NAMES
)

# MaxText 0.2.5 names the fused attention kernel's residuals (its output, and the log-sum-exp
# beside it) "context" on TPU (the residual_checkpoint_name of its splash attention) and on GPU (the
# cuDNN flash path's output and lse); "attention_out" names the same output after the kernel.
# tierax's blockwise attention keeps that output and its log-sum-exp as its residuals, tagged
# attention_out: on those hardwares context is attention_out.  (MaxText's `hardware` key: tpu by
# default.)
CONTEXT = "context"
CONTEXT_HARDWARE = ("tpu", "gpu", "gpu_multiprocess")
# MaxText keeps a tensor if either of its names keeps it
_KEPT = {"remat": 0, "offload": 1, "device": 2}


def context_is_attention_out(hardware: str | None) -> bool:
    return (hardware or "tpu") in CONTEXT_HARDWARE


HEADER_NAME = "# tierax plan: "
HEADER_DESCRIPTION = "# tierax description: "


def is_override_file(data) -> bool:
    """A MaxText override mapping (``remat_policy: custom``) rather than a tierax plan file."""
    return isinstance(data, Mapping) and data.get("remat_policy") == "custom"


def _header(text: str, prefix: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    return None


def model_keys(cfg) -> dict:
    """MaxText's model keys for a tierax ModelConfig (``configs/models/*.yml`` spelling)."""
    theta = int(cfg.rope_theta) if float(cfg.rope_theta).is_integer() else cfg.rope_theta
    common = {
        "base_emb_dim": cfg.d_model,
        "base_num_query_heads": cfg.num_heads,
        "base_num_decoder_layers": cfg.num_layers,
        "vocab_size": cfg.vocab_size,
        "mlp_activations": ["silu", "linear"],
        "enable_dropout": False,
        "logits_via_embedding": cfg.tie_embeddings,
        "normalization_layer_epsilon": cfg.norm_eps,
        "rope_max_timescale": theta,
        "dtype": cfg.dtype,
        "weight_dtype": cfg.param_dtype,
        **({"mu_dtype": cfg.mu_dtype} if cfg.mu_dtype else {}),
        # MaxText's own key and values: "" (none), "fp8" (tierax.models.fp8) or "te_mxfp8"
        # (tierax.models.mxfp8; MAXTEXT_QUANTIZATION)
        "quantization": maxtext_quantization(cfg.quantization),
    }
    if cfg.family == "llama":
        experts = (
            {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok}
            if cfg.num_experts
            else {}
        )
        return {
            # MaxText's Mixtral configs run the "mistral" decoder block (GQA + routed SwiGLU
            # experts)
            "decoder_block": "mistral" if cfg.num_experts else "llama2",
            **common,
            "base_num_kv_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim,
            "base_mlp_dim": cfg.mlp_dim,
            **experts,
        }
    if cfg.family == "deepseek":
        return {
            "decoder_block": "deepseek",
            "attention_type": "mla",
            **common,
            "base_num_kv_heads": cfg.num_heads,
            "base_mlp_dim": cfg.dense_mlp_dim,
            "base_moe_mlp_dim": cfg.expert_mlp_dim,
            "first_num_dense_layers": cfg.first_dense_layers,
            "num_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.num_experts_per_tok,
            "shared_experts": cfg.num_shared_experts,
            "routed_scaling_factor": cfg.routed_scaling_factor,
            "routed_score_func": "sigmoid",
            "q_lora_rank": cfg.q_lora_rank,
            "kv_lora_rank": cfg.kv_lora_rank,
            "qk_nope_head_dim": cfg.qk_nope_head_dim,
            "qk_rope_head_dim": cfg.qk_rope_head_dim,
            "v_head_dim": cfg.v_head_dim,
        }
    raise TieraxError(
        f"model family {cfg.family!r} has no MaxText form; MaxText overrides exist "
        "for: llama, deepseek"
    )


# MaxText's host-offload switches for the training state (all layers at once, embedding included).
OPTIMIZER_OFFLOAD = "optimizer_memory_host_offload"
PARAMETER_OFFLOAD = "parameter_memory_host_offload"
PARAMETER_OFFLOAD_DIFFERS = (
    "MaxText keeps the whole parameters in host memory between steps and moves them to the device "
    "for the step, so the forward and backward hold them as before; tierax's master_weights: "
    "offload keeps the float32 masters on the host and a compute-dtype copy on the device"
)


def state_dict(data: Mapping, groups, *, source: str) -> dict:
    """The plan's ``state`` a MaxText override mapping describes: every layer group's moments
    offloaded where ``optimizer_memory_host_offload`` is true.

    Raises:
      TieraxError: a value that is not a boolean, or ``parameter_memory_host_offload: true``
        (no tierax counterpart: :data:`PARAMETER_OFFLOAD_DIFFERS`).
    """
    for key in (OPTIMIZER_OFFLOAD, PARAMETER_OFFLOAD):
        if key in data and not isinstance(data[key], bool):
            raise TieraxError(f"{source}: {key}: {data[key]!r} is not a boolean; use true or false")
    if data.get(PARAMETER_OFFLOAD):
        raise TieraxError(
            f"{source}: {PARAMETER_OFFLOAD}: true has no tierax counterpart "
            f"({PARAMETER_OFFLOAD_DIFFERS}); set it to false or remove it"
        )
    if data.get(OPTIMIZER_OFFLOAD):
        return {g: {"moments": "offload"} for g in groups}
    return {}


def check_model(data: Mapping, cfg, source: str) -> None:
    """Refuse overrides written for another model: a model key whose value differs from ``cfg``'s.

    A file without model keys (placements only) is not checked.
    """
    if cfg.family not in ("llama", "deepseek"):
        return  # a custom model (the Python API) has no MaxText model keys to compare
    want = model_keys(cfg)
    diff = [f"{k} {data[k]!r} (here {v!r})" for k, v in want.items() if k in data and data[k] != v]
    if diff:
        raise TieraxError(
            f"{source} is MaxText overrides for another model than {cfg.name}: {'; '.join(diff)}. "
            "Use it with the model it was written for, or delete its model keys to apply only its "
            "placements"
        )


def plan_dict(
    data: Mapping, groups: Mapping[str, tuple[str, ...]], *, source: str, text: str = ""
) -> dict:
    """The tierax plan (``Plan.from_dict`` form) a MaxText override mapping describes for a model.

    Every activation of every group takes the placement of its key (MaxText's default
    where the file leaves a key out: ``device`` for decoder_layer_input, else ``remat``).  The
    plan's name and description come from the ``# tierax plan:`` / ``# tierax description:`` header
    lines tierax writes, else the file name.

    Args:
      data: the parsed file; groups: layer group → its activation names (the model's).

    Raises:
      TieraxError: a value other than remat/device/offload, ``decoder_layer_input:
        remat`` (MaxText refuses it), or a key without a tierax counterpart set to
        device/offload (tierax cannot model it; the message says what the key is).
    """
    placements: dict[str, str] = {}
    fused = context_is_attention_out(data.get("hardware"))
    for key in READ_KEYS:
        if key not in data:
            continue
        value = data[key]
        if value not in VALUES:
            raise TieraxError(
                f"{source}: {key}: {value!r} is not a MaxText placement; use one of: "
                f"{', '.join(VALUES)}"
            )
        if key == CONTEXT and fused:
            continue  # read with attention_out below
        if key in NO_COUNTERPART and value != "remat":
            raise TieraxError(
                f"{source}: {key}: {value} has no tierax counterpart ({NO_COUNTERPART[key]}); set "
                f"it to remat or remove it; tierax places: {', '.join(N.ALL_NAMES)}"
            )
        placements[key] = value
    if fused and data.get(CONTEXT, "remat") != "remat":
        # context and attention_out name one tensor: the placement that keeps more of it wins.
        placements[N.ATTENTION_OUT] = max(
            data[CONTEXT], placements.get(N.ATTENTION_OUT, "remat"), key=_KEPT.get
        )
    if placements.get(N.DECODER_LAYER_INPUT) == "remat":
        raise TieraxError(
            f"{source}: decoder_layer_input cannot be remat in MaxText (it is the layer's "
            "checkpoint); use device or offload"
        )
    name = _header(text, HEADER_NAME) or re.sub(r"\.ya?ml$", "", source.rsplit("/", 1)[-1])
    description = _header(text, HEADER_DESCRIPTION) or f"read from MaxText overrides {source}"
    out_groups = {
        g: {"default": "remat", **{n: placements.get(n, DEFAULTS[n]) for n in acts}}
        for g, acts in groups.items()
    }
    out = {"plan": name, "description": description, "groups": out_groups}
    state = state_dict(data, groups, source=source)
    found = planned_for(data, source)
    return out | ({"state": state} if state else {}) | ({"planned_for": found} if found else {})


# MaxText's mesh keys (base.yml: ici_*_parallelism, dcn_*_parallelism) for tierax's mesh axes.
MESH_AXES = ("data", "fsdp", "tensor", "expert")


def planned_for(data: Mapping, source: str) -> dict:
    """The mesh, microbatch, accumulation and sequence length an override file describes (keys of
    a plan's ``planned_for``; only those the file sets): each axis is ``ici_{axis}_parallelism ×
    dcn_{axis}_parallelism``; the microbatch is ``per_device_batch_size`` × the tensor axis
    (MaxText counts every device, tierax the devices of the batch axes); ``grad_accum`` is
    ``gradient_accumulation_steps``; ``seq`` is ``max_target_length``.

    Raises:
      TieraxError: a parallelism tierax does not model (pipeline, context, sequence, ...) above
        1, a size that is not a positive integer (MaxText's -1, "the rest", included), or a
        per-device batch that is no whole number of sequences per device of the batch axes.
    """
    mesh_keys = [k for k in data if re.fullmatch(r"(ici|dcn)_\w+_parallelism", str(k))]
    other = [
        f"{k}: {data[k]!r}"
        for k in mesh_keys
        if str(k)[4:-len("_parallelism")] not in MESH_AXES and data[k] != 1
    ]
    if other:
        raise TieraxError(
            f"{source}: {', '.join(other)}: tierax models only the "
            f"{', '.join(MESH_AXES)} axes; set the others to 1 or plan this run without tierax"
        )
    out: dict = {}
    if any(str(k)[4:-len("_parallelism")] in MESH_AXES for k in mesh_keys):
        mesh = {}
        for axis in MESH_AXES:
            size = 1
            for part in ("ici", "dcn"):
                v = data.get(f"{part}_{axis}_parallelism", 1)
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise TieraxError(
                        f"{source}: {part}_{axis}_parallelism: {v!r}; tierax reads explicit "
                        "sizes ≥ 1 (not -1): write the size of each axis"
                    )
                size *= v
            mesh[axis] = size
        out["mesh"] = mesh
    if "per_device_batch_size" in data:
        per = data["per_device_batch_size"]
        micro = per * out.get("mesh", {}).get("tensor", 1) if isinstance(per, int | float) else 0
        if isinstance(per, bool) or micro < 1 or abs(micro - round(micro)) > 1e-9:
            raise TieraxError(
                f"{source}: per_device_batch_size {per!r} × tensor "
                f"{out.get('mesh', {}).get('tensor', 1)} is no whole number ≥ 1 of sequences per "
                "device of the batch axes; write one that is"
            )
        out["microbatch"] = round(micro)
    if "gradient_accumulation_steps" in data:
        out["grad_accum"] = data["gradient_accumulation_steps"]
    if "max_target_length" in data:
        out["seq"] = data["max_target_length"]
    return out
