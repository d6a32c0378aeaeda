"""cuDNN's fused attention where tierax compiles it without a GPU.

Three things a deviceless CUDA compile needs: the installed cuDNN's version (the target config
states it), the compile target's compute capability for JAX's trace-time checks of the kernel's
limits, and the backward kernel's workspace, which the compile cannot size.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import re

from tierax.errors import TieraxError

CUDNN_DISTRIBUTION = "nvidia-cudnn-cu13"
FORWARD_CALL = "__cudnn$fmhaSoftmax"
BACKWARD_CALL = "__cudnn$fmhaSoftmaxBackward"
# The workspace of cuDNN's flash-attention backward: a float32 dQ accumulator [B, H, S, d_qk] and a
# float32 [B, H, S] row term, plus 256 bytes.  Sized by XLA's deviceless compile only in its
# CUDNN_DEVICELESS_COMPILATION_ALWAYS mode with a CUDA driver library present (not on these
# machines); the formula equals both sizes that route reported (tests/test_cudnn.py).
WORKSPACE_EXTRA_BYTES = 256


def installed_version() -> tuple[int, int, int] | None:
    """(major, minor, patch) of the cuDNN wheel JAX's CUDA plugin loads, or None if it is absent."""
    try:
        text = importlib.metadata.version(CUDNN_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    parts = [int(p) for p in re.findall(r"\d+", text)[:3]]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


def require() -> tuple[int, int, int]:
    """The installed cuDNN's version; a clear error naming the install command when it is
    missing."""
    version = installed_version()
    if version is None:
        raise TieraxError(
            f"attention=cudnn needs cuDNN for the deviceless CUDA compile: pip install "
            f"'{CUDNN_DISTRIBUTION}>=9.10,<10' (the gpu-aot extra, which `make` installs), or "
            "use attention=blockwise"
        )
    return version


@contextlib.contextmanager
def target_capability(capability: tuple[int, int]):
    """Within this context, JAX's trace-time checks of cuDNN attention answer for ``capability``.

    JAX checks the kernel's limits (head dim ≤ 128 before Hopper, ≤ 256 from Hopper on) against the
    default backend's first GPU.  A deviceless compile's default backend is the host, which those
    checks read as a pre-Hopper device, refusing DeepSeek-V3's 192.  When the default backend is a
    GPU (a real run) this context changes nothing: the checks read the real device.
    """
    import jax
    from jax._src.cudnn import fused_attention_stablehlo as fa

    if jax.default_backend() == "gpu":
        yield
        return

    def at_least(c: str) -> bool:
        return tuple(int(x) for x in c.split(".")) <= tuple(capability)

    def equal(c: str) -> bool:
        return tuple(int(x) for x in c.split(".")) == tuple(capability)

    saved = fa.check_compute_capability, fa.is_cuda_compute_capability_equal
    fa.check_compute_capability, fa.is_cuda_compute_capability_equal = at_least, equal
    try:
        yield
    finally:
        fa.check_compute_capability, fa.is_cuda_compute_capability_equal = saved


def backward_workspace_bytes(batch: int, heads: int, seq: int, qk_head_dim: int) -> int:
    """Bytes of one cuDNN flash-attention backward call's workspace (per device)."""
    return 4 * batch * heads * seq * (qk_head_dim + 1) + WORKSPACE_EXTRA_BYTES


def custom_calls(hlo_text: str) -> dict[str, int]:
    """How many cuDNN attention forward and backward calls a compiled program holds."""
    fwd = len(re.findall(r'custom_call_target="' + re.escape(FORWARD_CALL) + r'"', hlo_text))
    bwd = len(re.findall(r'custom_call_target="' + re.escape(BACKWARD_CALL) + r'"', hlo_text))
    return {"forward": fwd, "backward": bwd}
