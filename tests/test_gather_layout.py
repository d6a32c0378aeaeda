"""XLA's transposed weight stacks and the dense seed case's peak, against the deviceless XLA:GPU
compile (slow)."""

from __future__ import annotations

import math
import re

import pytest

from tierax import costmodel as cm
from tierax import plan as plan_lib
from tierax.mesh import MeshShape
from tierax.models import get_config
from tierax.tracing.inventory import model_inventory
from tierax.tracing.model_program import for_inventory


def _layer_stack_transposes(hlo_text: str, num_layers: int) -> list[int]:
    """Bytes of each float32 ``wrapped_transpose`` of a layer stack (a dimension equal to the layer
    count)."""
    out = []
    for dims in re.findall(r"%wrapped_transpose[.\d]* = f32\[([\d,]+)\]", hlo_text):
        shape = [int(d) for d in dims.split(",")]
        if num_layers in shape:
            out.append(4 * math.prod(shape))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["fsdp=128", "fsdp=16,tensor=8"])
def test_llama405b_on_128_gb200_peak_host_and_transposed_stacks_match_xla(mesh):
    """Llama 3.1 405B, 2 × 8192 per device, q/k/v offloaded: the predicted peak within 10 % of
    XLA's, host bytes
    equal, and the model's transposed stacks exactly XLA's wrapped_transpose buffers (fsdp=128: wi_0
    and wi_1; fsdp=16 × tensor=8: mlp wo and attention wo)."""
    pytest.importorskip("jax_plugins.xla_cuda13")
    from tierax.mesh import parse_mesh
    from tierax.xla import compile as C

    cfg = get_config("llama3.1-405b")
    shape: MeshShape = parse_mesh(mesh)
    plan = plan_lib.preset("qkv-offload", cfg)
    inv = model_inventory(cfg, 2, 8192, shape.to_dict())
    pred = cm.simulate(plan, for_inventory(cfg, inv), cm.target_rates("gb200", cfg.dtype), "lhs")
    got, text = C.compile_for_target(cfg, plan, "gb200", microbatch=2, seq=8192, mesh=shape)
    assert abs(pred.peak_device_bytes / got.device_peak_bytes - 1) <= 0.10, (
        pred.breakdown,
        got.device_peak_bytes,
    )
    assert pred.host_bytes == got.host_temp_bytes
    stacks = _layer_stack_transposes(text, cfg.num_layers)
    assert len(stacks) == 2 and sum(stacks) == pred.breakdown.stack_copy_bytes
