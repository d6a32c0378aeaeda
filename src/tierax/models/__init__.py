"""Reference models with named activations.

The configs import without JAX (listing models and plans, reading files); building a model
imports Flax and JAX when first asked for."""

from __future__ import annotations

from tierax.models.config import (
    NAMED_CONFIGS,
    DeepSeekConfig,
    LayerGroup,
    LlamaConfig,
    ModelConfig,
    for_platform,
    get_config,
    require_quantization_runs,
)
from tierax.models.config_files import (
    FAMILIES,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    config_to_yaml,
    load_model_config,
)


def build_model(cfg: ModelConfig, *, seed: int = 0):
    """Allocate and initialise the model for ``cfg`` (a :class:`tierax.models.decoder.Decoder`)."""
    from flax import nnx

    from tierax.models import deepseek, llama

    builders = {"llama": llama.build, "deepseek": deepseek.build}
    return builders[cfg.family](cfg, nnx.Rngs(params=seed))


def abstract_model(cfg: ModelConfig):
    """The model with ShapeDtypeStruct leaves: nothing is allocated."""
    from flax import nnx

    return nnx.eval_shape(lambda: build_model(cfg))


def __getattr__(name: str):
    if name == "Decoder":
        from tierax.models.decoder import Decoder

        return Decoder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "for_platform",
    "require_quantization_runs",
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
