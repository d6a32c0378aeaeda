"""Reference models with named activations."""

from __future__ import annotations

from flax import nnx

from tierax.models import deepseek, llama
from tierax.models.config import (
    NAMED_CONFIGS,
    DeepSeekConfig,
    LayerGroup,
    LlamaConfig,
    ModelConfig,
    for_platform,
    get_config,
)
from tierax.models.config_files import (
    FAMILIES,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    config_to_yaml,
    load_model_config,
)
from tierax.models.decoder import Decoder

_BUILDERS = {"llama": llama.build, "deepseek": deepseek.build}


def build_model(cfg: ModelConfig, *, seed: int = 0) -> Decoder:
    """Allocate and initialise the model for ``cfg``."""
    return _BUILDERS[cfg.family](cfg, nnx.Rngs(params=seed))


def abstract_model(cfg: ModelConfig) -> Decoder:
    """The model with ShapeDtypeStruct leaves: nothing is allocated."""
    return nnx.eval_shape(lambda: build_model(cfg))


__all__ = [
    "for_platform",
    "FAMILIES",
    "NAMED_CONFIGS",
    "DeepSeekConfig",
    "Decoder",
    "LayerGroup",
    "LlamaConfig",
    "ModelConfig",
    "abstract_model",
    "apply_overrides",
    "build_model",
    "config_from_dict",
    "config_to_dict",
    "config_to_yaml",
    "get_config",
    "load_model_config",
]
