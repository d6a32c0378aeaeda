"""Model configurations: one frozen dataclass per model family, plus the named configs.

Invariants are checked in ``__post_init__`` with messages that name the fix.
Analytic helpers (``param_count``, ``activated_param_count``, ``layer_groups``)
live on the config so they can be tested against published figures without
allocating anything.

Users bring their own shapes as YAML and ``KEY=VALUE`` overrides
(:mod:`tierax.models.config_files`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from tierax import names as N
from tierax.errors import TieraxError

DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_IMPLS = ("xla", "blockwise", "cudnn", "cudnn_blockwise", "splash", "splash_blockwise")
# ``auto``: chosen per platform by :func:`for_platform` before anything is traced (cuDNN's fused
# attention on a GPU where the config admits it, splash attention on a TPU, blockwise elsewhere).
AUTO_ATTENTION = "auto"
ATTENTION_CHOICES = (*ATTENTION_IMPLS, AUTO_ATTENTION)
PLATFORMS = ("gpu", "tpu", "cpu")
# The ``quantization`` values run here: "" (every GEMM in the compute dtype), "fp8" (projections
# and expert GEMMs in fp8 with delayed scaling, tierax.models.fp8; MaxText's value) or "mxfp8"
# (the same GEMMs block-scaled MXFP8 with current scaling, Blackwell, tierax.models.mxfp8;
# MaxText's "te_mxfp8", tierax.interop.maxtext_keys).
QUANTIZATIONS = ("", "fp8", "mxfp8")
# The GPU targets whose tensor cores run block-scaled MXFP8 GEMMs (compute capability 10.x).
MXFP8_MIN_CAPABILITY = (10, 0)
MOE_IMPLS = ("capacity", "ragged")
# What an abstract trace on the host runs in place of an implementation that only a GPU runs.
HOST_TRACEABLE_ATTENTION = {"cudnn": "cudnn_blockwise", "splash": "splash_blockwise"}
# The fused kernels and where each runs (tierax.models.attention).
FUSED_ATTENTION_PLATFORM = {"cudnn": "gpu", "splash": "tpu"}


@dataclass(frozen=True)
class LayerGroup:
    """A run of identical layers executed by one ``lax.scan``.

    Attributes:
      name: group key used in plans (``decoder``, ``dense``, ``moe``).
      num_layers: scan length.
      activations: the checkpoint names tagged inside one layer of this group.
    """

    name: str
    num_layers: int
    activations: tuple[str, ...]


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise TieraxError(msg)


def _check_common(cfg: Any) -> None:
    for key in ("dtype", "param_dtype"):
        _check(
            getattr(cfg, key) in DTYPES,
            f"{key}={getattr(cfg, key)!r} is not a supported dtype; use one of {', '.join(DTYPES)}",
        )
    _check(
        cfg.mu_dtype in ("", *DTYPES),
        f"mu_dtype={cfg.mu_dtype!r} is not a supported dtype; use one of {', '.join(DTYPES)} "
        "(or leave it empty: AdamW's first moment in param_dtype)",
    )
    for key in ("vocab_size", "d_model", "num_layers", "num_heads"):
        v = getattr(cfg, key)
        _check(
            isinstance(v, int) and not isinstance(v, bool) and v > 0,
            f"{key} must be a positive integer, got {v!r}",
        )
    _check(cfg.norm_eps > 0, f"norm_eps must be > 0, got {cfg.norm_eps!r}")
    _check(
        cfg.attention in ATTENTION_CHOICES,
        f"attention={cfg.attention!r} is not an attention implementation; use one of "
        f"{', '.join(ATTENTION_CHOICES)}",
    )
    _check(
        isinstance(cfg.attention_block, int) and cfg.attention_block > 0,
        f"attention_block must be a positive integer, got {cfg.attention_block!r}",
    )
    _check(cfg.rope_theta > 0, f"rope_theta must be > 0, got {cfg.rope_theta!r}")
    _check(
        isinstance(cfg.scan_unroll, int)
        and not isinstance(cfg.scan_unroll, bool)
        and cfg.scan_unroll >= 1,
        f"scan_unroll must be an integer ≥ 1 (layers per trip of a layer scan), got "
        f"{cfg.scan_unroll!r}",
    )
    _check(
        cfg.quantization in QUANTIZATIONS,
        f"quantization={cfg.quantization!r} is not supported; use one of "
        f"{', '.join(repr(q) for q in QUANTIZATIONS)} ('' keeps every GEMM in the compute dtype; "
        "'fp8' runs the projections and expert GEMMs in fp8 with delayed scaling; 'mxfp8' runs "
        "them block-scaled MXFP8, on Blackwell targets)",
    )


def _fused_attention_problem(cfg: Any) -> str | None:
    """Why cuDNN's flash attention cannot run ``cfg`` (None: it can): 16-bit compute, q/k head dim
    a multiple of 8 up to 256 (Hopper and later; the v head dim is padded to it,
    tierax.models.attention)."""
    if cfg.dtype not in ("bfloat16", "float16"):
        return (
            f"runs cuDNN's flash attention, on CUDA GPUs only and in dtype bfloat16 or float16 "
            f"(got {cfg.dtype}); for a GPU set dtype=bfloat16, elsewhere use attention=blockwise "
            "(or splash on a TPU)"
        )
    _, dqk, dv = cfg.attention_dims()
    if not (dqk % 8 == 0 and dqk <= 256 and dv <= dqk):
        return (
            f"cuDNN's flash attention needs a q/k head dim that is a multiple of 8, at most 256, "
            f"and no smaller than the v head dim (got {dqk} and {dv}); use attention=blockwise"
        )
    return None


def _check_fused_attention(cfg: Any) -> None:
    if cfg.attention not in ("cudnn", "cudnn_blockwise"):
        return
    problem = _fused_attention_problem(cfg)
    _check(problem is None, f"attention={cfg.attention}: {problem}")


def _check_moe_impl(cfg: Any) -> None:
    _check(
        cfg.moe_impl in MOE_IMPLS,
        f"moe_impl={cfg.moe_impl!r} is not a MoE implementation; use one of {', '.join(MOE_IMPLS)}",
    )
    _check(
        not (cfg.moe_impl == "ragged" and cfg.quantization == "mxfp8"),
        "quantization=mxfp8 runs the expert GEMMs of moe_impl=capacity only (ragged_dot has no "
        "block-scaled form here); use moe_impl=capacity or another quantization",
    )


def _check_loss_tiles(cfg: Any) -> None:
    v = cfg.loss_tiles
    _check(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1,
        f"loss_tiles must be an integer ≥ 1 (1: logits in one piece), got {v!r}",
    )


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP — dense, or with
    ``num_experts`` > 0 a Mixtral-style mixture of experts in place of the MLP (every layer;
    ``num_experts_per_tok`` of them per token, each an ``mlp_dim`` SwiGLU; softmax router, top-k,
    gates renormalised over the chosen experts: Jiang et al. 2024, "Mixtral of Experts", §2.1).
    Tokens are dispatched into per-expert buffers of ``capacity`` (see DeepSeekConfig), or with
    ``moe_impl: ragged`` run dropless as grouped GEMMs (:mod:`tierax.models.moe`, the same code as
    DeepSeek's)."""

    family: ClassVar[str] = "llama"
    router_score: ClassVar[str] = "softmax"  # how tierax.models.moe.route scores experts
    name: str = "custom-llama"
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    tie_embeddings: bool = False
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5
    dtype: str = "float32"  # activation / compute dtype
    param_dtype: str = "float32"  # master weights
    # AdamW's first moment (MaxText's mu_dtype; optax.adamw's): "" = param_dtype.  The second
    # moment stays in param_dtype.
    mu_dtype: str = ""
    # xla (materialises scores) | blockwise (flash-style) | cudnn (fused, GPU) | cudnn_blockwise
    # (its XLA form) | splash (Pallas kernel, TPU) | splash_blockwise (its XLA form) | auto (per
    # platform, for_platform); tierax.models.attention
    attention: str = "xla"
    attention_block: int = 512  # keys per block for blockwise attention
    # the loss's logits are computed in this many chunks of batch×sequence (tierax.models.loss)
    loss_tiles: int = 1
    # layers per trip of each layer group's scan (lax.scan's unroll): the same computation, for
    # analysis — XLA's cost_analysis counts a loop body once whatever its trip count, so a body of
    # 2 layers is counted twice as much as one of 1 (bench/xla_cost_check.py)
    scan_unroll: int = 1
    # Mixtral-style MoE (0: dense)
    num_experts: int = 0
    num_experts_per_tok: int = 2
    capacity_factor: float = 1.0
    # capacity | ragged (dropless grouped GEMMs, ragged_dot; TPU targets): see DeepSeekConfig
    moe_impl: str = "capacity"
    # "" | "fp8" | "mxfp8": the projections' GEMMs in fp8, delayed scaling (tierax.models.fp8),
    # or block-scaled MXFP8 (tierax.models.mxfp8, Blackwell targets); the embedding, LM head,
    # norms, attention's softmax, the loss and the optimizer are unchanged
    quantization: str = ""

    def __post_init__(self) -> None:
        _check_common(self)
        for key in ("num_kv_heads", "head_dim", "mlp_dim"):
            v = getattr(self, key)
            _check(isinstance(v, int) and v > 0, f"{key} must be a positive integer, got {v!r}")
        _check(
            isinstance(self.num_experts, int) and self.num_experts >= 0,
            "num_experts must be a non-negative integer (0: a dense MLP), got "
            f"{self.num_experts!r}",
        )
        if self.num_experts:
            _check(
                isinstance(self.num_experts_per_tok, int)
                and 1 <= self.num_experts_per_tok <= self.num_experts,
                f"num_experts_per_tok={self.num_experts_per_tok!r} must be between 1 and "
                f"num_experts={self.num_experts}",
            )
            _check(
                self.capacity_factor > 0,
                f"capacity_factor must be > 0, got {self.capacity_factor!r}",
            )
        _check_moe_impl(self)
        _check(
            self.moe_impl == "capacity" or self.num_experts > 0,
            f"moe_impl={self.moe_impl} is an implementation of a mixture of experts and this "
            "config is dense (num_experts=0); leave moe_impl out or set num_experts",
        )
        _check(
            self.num_heads % self.num_kv_heads == 0,
            f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}; "
            "grouped-query attention needs a whole number of query heads per key/value head",
        )
        _check(self.head_dim % 2 == 0, f"head_dim={self.head_dim} must be even for RoPE")
        _check_loss_tiles(self)
        _check_fused_attention(self)

    def layer_groups(self) -> tuple[LayerGroup, ...]:
        mlp = N.MOE_NAMES if self.num_experts else N.MLP_NAMES
        acts = (N.DECODER_LAYER_INPUT,) + N.GQA_ATTENTION_NAMES + mlp
        return (LayerGroup("decoder", self.num_layers, acts),)

    # --- the MoE's shape, as DeepSeekConfig names it -------------------------
    @property
    def expert_mlp_dim(self) -> int:
        return self.mlp_dim

    num_shared_experts: ClassVar[int] = 0
    routed_scaling_factor: ClassVar[float] = 1.0

    def expert_params(self) -> int:
        return 3 * self.d_model * self.mlp_dim

    def router_params(self) -> int:
        return self.d_model * self.num_experts

    def capacity(self, tokens: int) -> int:
        """Slots per expert for ``tokens`` routed tokens."""
        return max(
            1,
            math.ceil(tokens * self.num_experts_per_tok / self.num_experts * self.capacity_factor),
        )

    # --- analytic sizes -------------------------------------------------
    def attention_params(self) -> int:
        d, h, k, hd = self.d_model, self.num_heads, self.num_kv_heads, self.head_dim
        return d * h * hd + 2 * d * k * hd + h * hd * d

    def mlp_params(self, experts: int | None = None) -> int:
        """The MLP's parameters (an MoE layer's: ``experts`` of its experts, default all, and the
        router)."""
        if not self.num_experts:
            return 3 * self.d_model * self.mlp_dim
        n = self.num_experts if experts is None else experts
        return n * self.expert_params() + self.router_params()

    def embedding_params(self) -> int:
        n = self.vocab_size * self.d_model
        return n if self.tie_embeddings else 2 * n

    def param_count(self) -> int:
        """All parameters (embedding, head, norms included)."""
        per_layer = self.attention_params() + self.mlp_params() + 2 * self.d_model
        return self.num_layers * per_layer + self.embedding_params() + self.d_model

    def activated_param_count(self) -> int:
        """Parameters one token touches: top-k experts of an MoE (embedding included)."""
        if not self.num_experts:
            return self.param_count()
        unused = self.num_experts - self.num_experts_per_tok
        return self.param_count() - self.num_layers * unused * self.expert_params()

    def matmul_params_per_token(self) -> int:
        """Weights each token multiplies by (embedding lookup excluded, LM head included)."""
        mlp = self.mlp_params(self.num_experts_per_tok if self.num_experts else None)
        return self.num_layers * (self.attention_params() + mlp) + self.vocab_size * self.d_model

    def attention_dims(self) -> tuple[int, int, int]:
        """(query heads, qk head dim, v head dim) for attention FLOPs."""
        return self.num_heads, self.head_dim, self.head_dim


@dataclass(frozen=True, kw_only=True)
class DeepSeekConfig:
    """DeepSeek-V3-style decoder: multi-head latent attention, shared + routed experts.

    The first ``first_dense_layers`` layers use a dense SwiGLU MLP and form their
    own layer group (``dense``); the rest are MoE layers (group ``moe``).
    Routing: sigmoid affinities, top-k, gates renormalised over the chosen experts
    and scaled by ``routed_scaling_factor`` (DeepSeek-V3 §2.1.2).  Node-limited
    group routing and the bias-based load balancing are not modelled: they do not
    change shapes, FLOPs or memory.  Tokens are dispatched into per-expert buffers
    of ``capacity = ceil(tokens * top_k / experts * capacity_factor)``.
    """

    family: ClassVar[str] = "deepseek"
    router_score: ClassVar[str] = "sigmoid"  # how tierax.models.moe.route scores experts
    name: str = "custom-deepseek"
    vocab_size: int
    d_model: int
    num_layers: int
    first_dense_layers: int
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    dense_mlp_dim: int
    num_experts: int
    num_experts_per_tok: int
    num_shared_experts: int
    expert_mlp_dim: int
    capacity_factor: float = 1.0
    # capacity (expert-parallel capacity GEMMs) | ragged (dropless grouped GEMMs, ragged_dot; TPU
    # targets, no expert/tensor parallelism): tierax.models.moe
    moe_impl: str = "capacity"
    routed_scaling_factor: float = 2.5
    tie_embeddings: bool = False
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6
    dtype: str = "float32"
    param_dtype: str = "float32"
    mu_dtype: str = ""  # see LlamaConfig.mu_dtype
    attention: str = "xla"
    attention_block: int = 512
    loss_tiles: int = 1  # see LlamaConfig.loss_tiles
    scan_unroll: int = 1  # see LlamaConfig.scan_unroll
    quantization: str = ""  # see LlamaConfig.quantization; the router stays float32

    def __post_init__(self) -> None:
        _check_common(self)
        for key in (
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "dense_mlp_dim",
            "num_experts",
            "num_experts_per_tok",
            "expert_mlp_dim",
        ):
            v = getattr(self, key)
            _check(isinstance(v, int) and v > 0, f"{key} must be a positive integer, got {v!r}")
        _check(
            isinstance(self.first_dense_layers, int)
            and 0 <= self.first_dense_layers <= self.num_layers,
            f"first_dense_layers={self.first_dense_layers!r} must be between 0 and "
            f"num_layers={self.num_layers}",
        )
        _check(
            isinstance(self.num_shared_experts, int) and self.num_shared_experts >= 0,
            f"num_shared_experts must be a non-negative integer, got {self.num_shared_experts!r}",
        )
        _check(
            self.num_experts_per_tok <= self.num_experts,
            f"num_experts_per_tok={self.num_experts_per_tok} (top-k) exceeds "
            f"num_experts={self.num_experts}",
        )
        _check(
            self.qk_rope_head_dim % 2 == 0,
            f"qk_rope_head_dim={self.qk_rope_head_dim} must be even for RoPE",
        )
        _check(
            self.capacity_factor > 0, f"capacity_factor must be > 0, got {self.capacity_factor!r}"
        )
        _check_moe_impl(self)
        _check_loss_tiles(self)
        _check_fused_attention(self)

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers

    def layer_groups(self) -> tuple[LayerGroup, ...]:
        attn = (N.DECODER_LAYER_INPUT,) + N.MLA_ATTENTION_NAMES
        groups = []
        if self.first_dense_layers:
            groups.append(LayerGroup("dense", self.first_dense_layers, attn + N.MLP_NAMES))
        if self.num_moe_layers:
            shared = N.MLP_NAMES if self.num_shared_experts else ()
            groups.append(LayerGroup("moe", self.num_moe_layers, attn + N.MOE_NAMES + shared))
        return tuple(groups)

    # --- analytic sizes -------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def attention_params(self) -> int:
        d, h = self.d_model, self.num_heads
        return (
            d * self.q_lora_rank
            + self.q_lora_rank * h * self.qk_head_dim
            + d * (self.kv_lora_rank + self.qk_rope_head_dim)
            + self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
            + h * self.v_head_dim * d
        )

    def attention_norm_params(self) -> int:
        return self.q_lora_rank + self.kv_lora_rank

    def expert_params(self) -> int:
        return 3 * self.d_model * self.expert_mlp_dim

    def router_params(self) -> int:
        return self.d_model * self.num_experts

    def embedding_params(self) -> int:
        n = self.vocab_size * self.d_model
        return n if self.tie_embeddings else 2 * n

    def _layer_params(self, experts_per_moe_layer: int) -> int:
        attn = self.attention_params() + self.attention_norm_params() + 2 * self.d_model
        dense = self.first_dense_layers * (attn + 3 * self.d_model * self.dense_mlp_dim)
        moe = self.num_moe_layers * (
            attn + self.router_params() + experts_per_moe_layer * self.expert_params()
        )
        return dense + moe

    def param_count(self) -> int:
        """All parameters: every routed and shared expert, embedding, head, norms."""
        return (
            self._layer_params(self.num_experts + self.num_shared_experts)
            + self.embedding_params()
            + self.d_model
        )

    def activated_param_count(self) -> int:
        """Parameters one token touches: top-k routed + shared experts (embedding included)."""
        return (
            self._layer_params(self.num_experts_per_tok + self.num_shared_experts)
            + self.embedding_params()
            + self.d_model
        )

    def matmul_params_per_token(self) -> int:
        per_attn = self.attention_params()
        dense = self.first_dense_layers * (per_attn + 3 * self.d_model * self.dense_mlp_dim)
        active = self.num_experts_per_tok + self.num_shared_experts
        moe = self.num_moe_layers * (
            per_attn + self.router_params() + active * self.expert_params()
        )
        return dense + moe + self.vocab_size * self.d_model

    def attention_dims(self) -> tuple[int, int, int]:
        return self.num_heads, self.qk_head_dim, self.v_head_dim

    def capacity(self, tokens: int) -> int:
        """Slots per expert for ``tokens`` routed tokens."""
        return max(
            1,
            math.ceil(tokens * self.num_experts_per_tok / self.num_experts * self.capacity_factor),
        )


ModelConfig = LlamaConfig | DeepSeekConfig

NAMED_CONFIGS: dict[str, ModelConfig] = {
    # CPU-sized: a train step takes well under a second.
    "tiny-llama": LlamaConfig(
        name="tiny-llama",
        vocab_size=256,
        d_model=64,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        mlp_dim=128,
    ),
    "tiny-deepseek": DeepSeekConfig(
        name="tiny-deepseek",
        vocab_size=256,
        d_model=64,
        num_layers=4,
        first_dense_layers=2,
        num_heads=4,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        dense_mlp_dim=128,
        num_experts=8,
        num_experts_per_tok=2,
        num_shared_experts=1,
        expert_mlp_dim=32,
        capacity_factor=1.25,
    ),
    # CPU-sized Mixtral-style MoE (GQA attention, 4 experts top-2, every layer).
    "tiny-mixtral": LlamaConfig(
        name="tiny-mixtral",
        vocab_size=256,
        d_model=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        mlp_dim=32,
        num_experts=4,
        num_experts_per_tok=2,
        capacity_factor=2.0,
    ),
    # Published shapes, used abstractly (never allocated on CPU).
    # Llama 3 8B: Meta's model card / params.json (dim 4096, 32 layers, 32 heads, 8 KV, ffn 14336).
    "llama3-8b": LlamaConfig(
        name="llama3-8b",
        vocab_size=128256,
        d_model=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=14336,
        dtype="bfloat16",
        attention=AUTO_ATTENTION,
    ),
    # Llama 2 7B and 70B: "Llama 2: Open Foundation and Fine-Tuned Chat Models" (Touvron et al.
    # 2023), Table 1 and the released params.json (7B: dim 4096, 32 layers, 32 heads, no GQA, ffn
    # 11008; 70B: dim 8192, 80 layers, 64 heads, 8 KV heads, ffn 28672; vocab 32000, RoPE 10000).
    "llama2-7b": LlamaConfig(
        name="llama2-7b",
        vocab_size=32000,
        d_model=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        mlp_dim=11008,
        rope_theta=10_000.0,
        dtype="bfloat16",
        attention=AUTO_ATTENTION,
    ),
    "llama2-70b": LlamaConfig(
        name="llama2-70b",
        vocab_size=32000,
        d_model=8192,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=28672,
        rope_theta=10_000.0,
        dtype="bfloat16",
        attention=AUTO_ATTENTION,
    ),
    # Llama 3 70B: "The Llama 3 Herd of Models", Table 3 (dim 8192, 80 layers, 64 heads, 8 KV heads,
    # ffn 28672, vocab 128256, RoPE 500000).
    "llama3-70b": LlamaConfig(
        name="llama3-70b",
        vocab_size=128256,
        d_model=8192,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=28672,
        dtype="bfloat16",
        attention=AUTO_ATTENTION,
    ),
    # Llama 3.1 405B: "The Llama 3 Herd of Models", Table 3.
    "llama3.1-405b": LlamaConfig(
        name="llama3.1-405b",
        vocab_size=128256,
        d_model=16384,
        num_layers=126,
        num_heads=128,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=53248,
        dtype="bfloat16",
        attention=AUTO_ATTENTION,
    ),
    # Mixtral 8x7B: "Mixtral of Experts" (Jiang et al. 2024), Table 1 (dim 4096, 32 layers, 32
    # heads, 8 KV heads, head dim 128, hidden 14336, 8 experts, top-2, vocab 32000, RoPE 1e6).
    "mixtral-8x7b": LlamaConfig(
        name="mixtral-8x7b",
        vocab_size=32000,
        d_model=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=14336,
        rope_theta=1_000_000.0,
        num_experts=8,
        num_experts_per_tok=2,
        dtype="bfloat16",
        attention=AUTO_ATTENTION,
    ),
    # DeepSeek-V3: technical report §4.2 / config.json (MTP module not included).
    "deepseek-v3-671b": DeepSeekConfig(
        name="deepseek-v3-671b",
        vocab_size=129280,
        d_model=7168,
        num_layers=61,
        first_dense_layers=3,
        num_heads=128,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        dense_mlp_dim=18432,
        num_experts=256,
        num_experts_per_tok=8,
        num_shared_experts=1,
        expert_mlp_dim=2048,
        dtype="bfloat16",
        attention=AUTO_ATTENTION,
    ),
}


def for_platform(cfg, platform: str, *, documents: bool = False):
    """``cfg`` with ``attention: auto`` chosen for ``platform`` (``gpu``, ``tpu`` or ``cpu``):
    cuDNN's fused flash attention on a GPU, which is what GPU training runs, wherever the config
    admits it (16-bit compute, legal head dims, no packed ``documents`` to mask: JAX's cuDNN entry
    takes no segment ids); the splash-attention Pallas kernel on a TPU, which is what MaxText's TPU
    runs use (it masks packed documents by segment ids); ``blockwise`` otherwise.  Any other
    attention is the user's choice and is returned as given.

    Raises:
      TieraxError: an unknown platform.
    """
    import dataclasses

    if platform not in PLATFORMS:
        raise TieraxError(f"unknown platform {platform!r}; use one of {', '.join(PLATFORMS)}")
    if cfg.attention != AUTO_ATTENTION:
        return cfg
    if platform == "tpu":
        return dataclasses.replace(cfg, attention="splash")
    fused = platform == "gpu" and not documents and _fused_attention_problem(cfg) is None
    return dataclasses.replace(cfg, attention="cudnn" if fused else "blockwise")


def require_concrete_attention(cfg, where: str) -> None:
    """Refuse ``attention: auto`` where it has not been chosen for a platform yet.

    Raises:
      TieraxError: naming the fix.
    """
    if cfg.attention == AUTO_ATTENTION:
        raise TieraxError(
            f"{where}: {cfg.name} has attention=auto, which is chosen per platform; resolve it "
            "first with tierax.models.for_platform(cfg, 'gpu' | 'tpu' | 'cpu') (the CLI does so "
            "from --target or the local backend), or set an attention (e.g. --set "
            "attention=blockwise)"
        )


def mxfp8_targets() -> tuple[str, ...]:
    """The targets that run block-scaled MXFP8 GEMMs: GPUs of compute capability 10.x and later
    (Blackwell: B200, GB200)."""
    from tierax import hardware

    return tuple(
        key
        for key, spec in hardware.TARGETS.items()
        if tuple(spec.compute_capability) >= MXFP8_MIN_CAPABILITY
    )


def require_quantization_runs(cfg, target: str) -> None:
    """Refuse ``quantization: mxfp8`` for a target without block-scaled MXFP8 GEMMs (Hopper, TPUs,
    the local CPU target), naming what runs there instead.

    Raises:
      TieraxError: naming the targets MXFP8 runs on and the quantization that runs on ``target``.
    """
    if getattr(cfg, "quantization", "") != "mxfp8":
        return
    from tierax import hardware

    if target in mxfp8_targets():
        return
    if target == "cpu":
        what = "a CPU"
        there = "quantization=fp8 (its numerics emulated) or none"
    else:
        spec = hardware.get_target(target)
        what = (
            f"a {spec.kind.upper()}"
            if spec.kind == "tpu"
            else f"compute capability {'.'.join(map(str, spec.compute_capability))}"
        )
        rated = "fp8" in spec.peak_flops
        there = (
            "quantization=fp8 (per-tensor delayed scaling"
            + (", its fp8 GEMMs" if rated else ", its numerics emulated")
            + ") or none"
        )
    raise TieraxError(
        f"quantization=mxfp8 (block-scaled MXFP8 GEMMs) runs on Blackwell targets "
        f"({', '.join(mxfp8_targets())}); {target} is {what}, without them: use {there} there "
        "(--set quantization=fp8 or --set quantization=)"
    )


def host_traceable(cfg):
    """``cfg`` with an attention that a host trace can run in place of one only a GPU or TPU runs
    (``cudnn`` → ``cudnn_blockwise``, ``splash`` → ``splash_blockwise``: same residuals, XLA math;
    tierax.models.attention)."""
    import dataclasses

    impl = HOST_TRACEABLE_ATTENTION.get(cfg.attention)
    return cfg if impl is None else dataclasses.replace(cfg, attention=impl)


# Llama 3.1 8B and 70B: the shapes of Llama 3 8B and 70B (Meta's params.json; 3.1's RoPE scaling and
# longer context are not modelled).
NAMED_CONFIGS["llama3.1-8b"] = dataclasses.replace(NAMED_CONFIGS["llama3-8b"], name="llama3.1-8b")
NAMED_CONFIGS["llama3.1-70b"] = dataclasses.replace(
    NAMED_CONFIGS["llama3-70b"], name="llama3.1-70b"
)

# MaxText's model names for the same shapes (its configs/models/*.yml): looked up as the config they
# name.
ALIASES: dict[str, str] = {"deepseek3-671b": "deepseek-v3-671b"}


def get_config(name: str) -> ModelConfig:
    """Look up a named config (or MaxText's name for one, :data:`ALIASES`); an unknown name lists
    the valid ones."""
    try:
        return NAMED_CONFIGS[ALIASES.get(name, name)]
    except KeyError:
        raise TieraxError(
            f"unknown model {name!r}; choose one of: {', '.join(NAMED_CONFIGS)}"
        ) from None

