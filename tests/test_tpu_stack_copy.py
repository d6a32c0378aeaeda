"""XLA:TPU's compute-dtype copies of the stacked layer weights (the cost model's TPU stack-copy
term), against the shards XLA:TPU's own compile holds: tiny-deepseek in bfloat16 on a v5e 2x2
slice, mesh fsdp=2 × expert=2, microbatch 2 × seq 128 per device.

Read off that compile's HLO: each routed-expert stack is f32[2, 4, 32, 32] per device (2 MoE
layers, 8 experts / expert 2, d_model 64 / fsdp 2, expert MLP 32), converted once to bf16 before
the forward loop; every other layer weight is split four ways (fsdp × expert).
"""

import dataclasses
import importlib.util
import math
import re
import subprocess
import sys

import pytest

from tierax.costmodel import fixed
from tierax.models import get_config
from tierax.tracing import inventory as inv_lib
from tierax.tracing import model_program

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
MESH = {"fsdp": 2, "expert": 2}


def _model_bytes() -> int:
    cfg = dataclasses.replace(get_config("tiny-deepseek"), dtype="bfloat16")
    inv = inv_lib.model_inventory(cfg, 2, 128, MESH)
    return fixed._tpu_stack_copy_bytes(model_program.for_inventory(cfg, inv), 2, 4, 2)


def test_expert_stacks_are_divided_by_fsdp_times_expert_once():
    # By hand: per MoE layer 3 expert matrices of E·D·F = 8·64·32 over expert 2 × fsdp 2 (XLA's
    # f32[2, 4, 32, 32]), 2 layers; the dense weights of both groups over 4.
    cfg = get_config("tiny-deepseek")
    inv = inv_lib.model_inventory(dataclasses.replace(cfg, dtype="bfloat16"), 2, 128, MESH)
    dense = {g.name: g.layer_param_count - g.expert_param_count_per_layer for g in inv.groups}
    experts = 3 * 8 * 64 * 32
    assert {g.name: g.expert_param_count_per_layer for g in inv.groups} == {
        "dense": 0,
        "moe": experts,
    }
    per_device_expert_stack = 2 * 4 * 32 * 32  # one f32[2, 4, 32, 32]
    want = 2 * (2 * dense["dense"] / 4 + 2 * dense["moe"] / 4 + 3 * per_device_expert_stack)
    assert _model_bytes() == int(want) == 106336


@pytest.mark.slow
@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed (the tpu-aot extra)")
def test_stack_copy_is_the_bytes_xla_tpu_converts():
    """The bf16 converts of stacked f32 weights in the compiled entry computation, summed, equal
    the model's term less the norm scales and the router, which XLA:TPU keeps in float32 (by hand:
    per layer the four norms 64/4 + 64/4 + 32/4 + 16/4 = 44 values, ×4 layers, and the router's
    64·8/4 = 128 per MoE layer, ×2: 432 values, 864 B in bf16)."""
    code = (
        "from tierax import launch, hardware\n"
        "launch.start_deviceless_tpu('none', hardware.get_target('v5e').accelerator_type(4))\n"
        "import dataclasses, sys\n"
        "from tierax.mesh import MeshShape\n"
        "from tierax.models import get_config\n"
        "from tierax.plan import preset\n"
        "from tierax.xla import compile as tc\n"
        "cfg = dataclasses.replace(get_config('tiny-deepseek'), dtype='bfloat16')\n"
        "_, text = tc.compile_for_target(cfg, preset('save-all', cfg), 'v5e', microbatch=2,"
        " seq=128, mesh=MeshShape(fsdp=2, expert=2))\n"
        "sys.stdout.write(text)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    entry = p.stdout[p.stdout.index("\nENTRY") :]
    signature = entry[: entry.index("->")]
    stacked = {s for s in re.findall(r"f32\[([\d,]+)\]", signature) if s.startswith("2,")}
    assert "2,4,32,32" in stacked  # the expert stacks' per-device shard
    converted = sum(
        2 * math.prod(int(x) for x in shape.split(","))
        for shape in re.findall(r"^\s*%\S+ = bf16\[([\d,]+)\]\{[^}]*\} convert\(", entry, re.M)
        if shape in stacked
    )
    assert _model_bytes() - converted == 864, (_model_bytes(), converted)
