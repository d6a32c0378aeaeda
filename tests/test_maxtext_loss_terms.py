"""MaxText's loss on a GPU (:mod:`tierax.interop.maxtext_program.loss_terms`): the Program's
``loss_bytes``, ``after_backward_bytes``, ``late_grad_bytes`` and ``stack_copy_params`` counted by
hand from the config's shapes, the cost model's layer phase without the late gradients, and (slow)
the buffers XLA:GPU's compile of a MaxText step holds beside the rules.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import subprocess
import sys

import maxtext_cli as M
import pytest
from xla_dump import dump_text as _dump
from xla_dump import live_at as _live_at
from xla_dump import temp_values as _temp_values

pytestmark = [M.requires_maxtext, M.programs_once]

TINY = [*M.TINY, "remat_policy=full"]
D, HEADS, KV, HD, MLP, LAYERS, VOCAB = M.D, M.HEADS, M.KV, M.HD, M.MLP, M.LAYERS, M.VOCAB
MICROBATCH, SEQ, FSDP = 2, 128, 4
BF16, F32 = 2, 4


@pytest.fixture(scope="module")
def run():
    """The tiny config on 4 H200s (MaxText's ici_fsdp_parallelism=-1: fsdp=4), untiled."""
    from tierax.interop.maxtext_program import program

    return program(M.base_yml(), TINY, target="h200", devices=FSDP, microbatch=MICROBATCH, seq=SEQ)


def _layer_params_per_device() -> int:
    return M.tiny_layer_params_per_device(FSDP)


def _outside_params_per_device() -> int:
    return M.tiny_outside_params_per_device(FSDP)


def test_loss_holds_the_gathered_head_and_compute_dtype_logits(run):
    p = run.program
    assert p.mesh["fsdp"] == FSDP and p.head.tiles == 1
    tokens = MICROBATCH * SEQ
    # the head cast to bf16 and gathered (unsharded), the logits and their gradient in bf16: no
    # float32 logits and no head gradient at the loss
    assert p.loss_bytes == BF16 * D * VOCAB + 2 * BF16 * tokens * VOCAB


def test_loss_in_the_layer_gradients_slots_once_they_are_larger(run):
    """Where the gathered head and the two logits buffers are no larger than the layer gradients
    (float32, per device), XLA:GPU lays them out in the gradients' slots and the loss adds only
    the logits' gradient; below that, all three.  The tiny config's stacks deepened by hand: per
    layer 147,968 parameters per device (591,872 bytes of float32 gradient), the loss's buffers
    524,288 + 2 × 524,288 bytes, so 3 layers (1,775,616 bytes) are the first that hold them.
    (The slow test below checks the layout in XLA:GPU's compile at 16 layers.)"""
    from tierax.interop.maxtext_program.loss_terms import layer_grad_params, loss_layout_bytes

    inv = run.program.inventory
    assert layer_grad_params(inv) == _layer_params_per_device()
    tokens = MICROBATCH * SEQ
    head, logits = BF16 * D * VOCAB, BF16 * tokens * VOCAB
    per_layer = F32 * _layer_params_per_device() // LAYERS
    assert (head, logits, per_layer) == (524_288, 524_288, 591_872)
    assert run.program.loss_bytes == loss_layout_bytes(head, logits, LAYERS * per_layer)
    for layers, want in ((1, head + 2 * logits), (2, head + 2 * logits), (3, logits), (8, logits)):
        assert loss_layout_bytes(head, logits, layers * per_layer) == want, layers
    # the boundary: the loss's buffers exactly the layer gradients' bytes fit in their slots
    assert loss_layout_bytes(head, logits, head + 2 * logits) == logits
    assert loss_layout_bytes(head, logits, head + 2 * logits - 1) == head + 2 * logits


def test_after_backward_holds_the_unsharded_compute_dtype_head_gradient(run):
    p = run.program
    inv = p.inventory
    assert inv.param_bytes == F32 * (_layer_params_per_device() + _outside_params_per_device())
    layer_grads = F32 * _layer_params_per_device()
    tokens = MICROBATCH * SEQ
    # the head's gradient in bf16, unsharded, with the larger of the logits' gradient and its
    # reduce-scatter's shard plus the embedding's gradient shard (bf16)
    rest = max(BF16 * tokens * VOCAB, 2 * BF16 * D * VOCAB // FSDP)
    want = inv.param_bytes + inv.optimizer_bytes + layer_grads + BF16 * D * VOCAB + rest
    assert p.after_backward_bytes == want


def test_late_gradients_and_stack_copies(run):
    p = run.program
    # the embedding's and head's float32 gradients (and the final norm's) are written after the
    # layers' backward
    assert p.late_grad_bytes == F32 * _outside_params_per_device()
    assert p.inventory.grad_bytes - p.late_grad_bytes == F32 * _layer_params_per_device()
    # every stacked layer weight's float32 shard copied layer-first
    assert p.stack_copy_params == _layer_params_per_device()


def test_layer_phase_leaves_out_the_late_gradients(run):
    """The cost model's layer phase: the state less the late gradients, the workspace, the stack
    copies and the fixed bytes; the loss phase: the state less the embedding's and head's
    gradients, the loss's bytes, the stack copies and the fixed bytes."""
    from tierax.costmodel import rates as rates_lib
    from tierax.costmodel.fixed import fixed_terms

    p = run.program
    rates = rates_lib.target_rates("h200", "bfloat16")
    ft = fixed_terms(p, rates, "lhs")
    inv = p.inventory
    state = inv.param_bytes + inv.grad_bytes + inv.optimizer_bytes
    assert ft.stack_copy_bytes == F32 * _layer_params_per_device()
    layer = state - F32 * _outside_params_per_device()
    layer += ft.workspace_bytes + ft.stack_copy_bytes + ft.fixed_device_bytes
    assert ft.layer_phase_bytes == max(layer, p.after_backward_bytes + ft.fixed_device_bytes)
    # (the cost model's GPU loss phase leaves out the outside parameters' gradients as sharded)
    loss = state - F32 * (2 * VOCAB * D + D) // FSDP + p.loss_bytes
    assert ft.loss_phase_bytes == loss + ft.stack_copy_bytes + ft.fixed_device_bytes
    without = fixed_terms(dataclasses.replace(p, late_grad_bytes=0), rates, "lhs")
    assert without.layer_phase_bytes - ft.layer_phase_bytes == p.late_grad_bytes


def test_tiled_loss_keeps_the_cost_models_reading():
    """A tiled loss on a GPU was not traced: the cost model's own loss, no after-backward phase or
    late gradients; the layer stacks' copies all the same."""
    from tierax.interop.maxtext_program import program

    p = program(
        M.base_yml(),
        [*TINY, "num_vocab_tiling=2"],
        target="h200",
        devices=FSDP,
        microbatch=MICROBATCH,
        seq=SEQ,
    ).program
    assert p.head.tiles == 2
    assert (p.loss_bytes, p.after_backward_bytes, p.late_grad_bytes) == (None, 0, 0)
    assert p.stack_copy_params == _layer_params_per_device()


# ---------------------------------------------------------------------------------------------
# The slow check: XLA:GPU's compile of a MaxText step (dumped) holds the buffers the rules name.

SMALL_D, SMALL_VOCAB, SMALL_TOKENS = 1024, 32768, 1024
SMALL = [
    f"base_emb_dim={SMALL_D}",
    "base_num_query_heads=8",
    "base_num_kv_heads=8",
    "head_dim=128",
    "base_mlp_dim=4096",
    "base_num_decoder_layers=2",
    f"vocab_size={SMALL_VOCAB}",
    "per_device_batch_size=1",
    f"max_target_length={SMALL_TOKENS}",
    "remat_policy=full",
]


def _layer_grad_slots(values: dict, dump: pathlib.Path, layers: int) -> tuple[int, int]:
    """The offsets [lowest, highest end) of the layer gradients' float32 accumulators: the layers'
    backward loop's (the step's last while) float32 outputs stacked over the ``layers``, the
    weights' (the norm scales' small ``[layers, emb]`` gradients aside)."""
    seq = _dump(dump, "-live-range.txt").split("BufferLiveRange:")[0]
    last = max(int(i) for i, _ in re.findall(r"^\s+(\d+):(while\S*)$", seq, re.M))
    grads = [
        v
        for v in values.values()
        if v["range"][0] == last
        and v["shape"].startswith("f32[")
        and str(layers) in v["shape"][4:-1].split(",")
        and len(v["shape"].split(",")) > 2
    ]
    assert grads, "no float32 layer-stacked output of the backward loop"
    return min(v["offset"] for v in grads), max(v["offset"] + v["bytes"] for v in grads)


def _compile(keys: list[str], dump: pathlib.Path) -> dict:
    return M.compile_dumped(keys, dump)


@pytest.mark.slow
def test_xla_gpu_holds_the_rules_buffers(tmp_path):
    """MaxText's step compiled for 4 H200s (compile --maxtext, dumped): the head gathered in bf16
    at the loss, the logits and their gradient in bf16, no float32 [*, vocab] buffer, the head's
    gradient in bf16 and unsharded after the layers' backward loop with its bf16 shard; XLA's
    bytes at the loss are the rule's plus the stack copies, the kept activations and small
    buffers.  (Slow: a MaxText compile; the default tests check the same rules by hand.)"""
    from tierax.interop.maxtext_program import program

    keys = [M.base_yml(), *SMALL, "--target", "h200", "--devices", str(FSDP)]
    dump = tmp_path / "dump"
    _compile(keys, dump)
    values = _temp_values(dump)
    dv, tv = f"[{SMALL_D},{SMALL_VOCAB}]", f"[{SMALL_TOKENS},{SMALL_VOCAB}]"
    shard = f"[{SMALL_D // FSDP},{SMALL_VOCAB}]"

    def named(shape_dims: str, forward: bool):
        return [
            v
            for v in values.values()
            if v["shape"] == "bf16" + shape_dims
            and ("transpose(jvp())" not in v["op"]) == forward
            and "jvp(" in v["op"]
        ]

    # no float32 logits, logits' gradient or head gradient in the temp
    assert not [v for v in values.values() if v["shape"] in ("f32" + dv, "f32" + tv)]
    # the loss: the head gathered in bf16, the logits in bf16 (both [1024, 32768] here: D = tokens)
    gathered = named(dv, forward=True)
    assert len(gathered) >= 2, [v["op"] for v in values.values() if v["shape"] == "bf16" + dv]
    # the loss's buffers (3 × 64 MiB) larger than the layer gradients (2 layers, 32 MiB): the
    # gradients' slots lie above the gathered head's
    low, _ = _layer_grad_slots(values, dump, 2)
    assert low >= min(v["offset"] + v["bytes"] for v in gathered), low
    # the backward: the logits' gradient in bf16 and the head's gradient in bf16, unsharded, made
    # after the layers' backward loop (the last while of the step)
    seq = _dump(dump, "-live-range.txt").split("BufferLiveRange:")[0]
    whiles = [int(i) for i, n in re.findall(r"^\s+(\d+):(while\S*)$", seq, re.M)]
    backward = named(dv, forward=False)
    assert any(v["range"][0] > max(whiles) for v in backward), [v["range"] for v in backward]
    assert any(v["range"][0] < max(whiles) < v["range"][1] for v in backward)  # logits' gradient
    assert named(shard, forward=False), "no bf16 shard of the head's gradient"
    # XLA's bytes at the loss (the logits' gradient made): the rule's buffers, the transposed
    # stack copies, the kept activations and small buffers; none of the layer gradients
    p = program(M.base_yml(), SMALL, target="h200", devices=FSDP).program
    grad_start = min(v["range"][0] for v in backward)
    at_loss = _live_at(values, grad_start)
    held = p.loss_bytes + F32 * p.stack_copy_params
    assert held <= at_loss <= held + 0.05 * held, (at_loss, held)


DEEP = 16  # the small config's layers where the layer gradients outgrow the loss's buffers


@pytest.mark.slow
def test_xla_gpu_lays_the_loss_into_the_layer_gradients_at_depth(tmp_path):
    """The small config at 16 layers, compiled for 4 H200s (dumped): the layer gradients' float32
    accumulators (16 × 16.8M parameters / 4 devices × 4 bytes = 268,435,456 bytes) are larger
    than the gathered head and two logits buffers (3 × 64 MiB = 201,326,592 bytes), so the rule's
    loss adds only the logits' gradient; XLA:GPU's compile places the gathered head and the logits
    inside the gradients' slots, and its peak is the one tierax predicts, in the layers' backward,
    within 5 %.  (Slow: a MaxText compile and a simulate; the default tests check the rule by hand
    at the tiny config's depths.)"""
    deep = [k for k in SMALL if not k.startswith("base_num_decoder_layers=")]
    deep.append(f"base_num_decoder_layers={DEEP}")
    keys = [M.base_yml(), *deep, "--target", "h200", "--devices", str(FSDP)]
    per_layer = 4 * SMALL_D * SMALL_D + 3 * SMALL_D * 4096
    grads = F32 * DEEP * per_layer // FSDP
    head = logits = BF16 * SMALL_D * SMALL_VOCAB  # [1024, 32768] both: D = tokens here
    assert (grads, head + 2 * logits) == (268_435_456, 201_326_592)
    dump = tmp_path / "dump"
    compiled = _compile(keys, dump)
    values = _temp_values(dump)
    forward = [
        v
        for v in values.values()
        if v["shape"] == f"bf16[{SMALL_D},{SMALL_VOCAB}]"
        and "jvp(" in v["op"]
        and "transpose(jvp())" not in v["op"]
    ]
    assert len(forward) >= 2, [v["op"] for v in forward]  # the gathered head, the logits
    low, high = _layer_grad_slots(values, dump, DEEP)
    assert high - low >= grads
    # the stack copies at depth: every stacked weight's whole float32 shard, copied before the
    # forward loop (not per layer): as many bytes as the layer gradients, norm scales aside
    copies = [
        v
        for v in values.values()
        if v["shape"].startswith("f32[") and str(DEEP) in v["shape"][4:-1].split(",")
        and v["range"][0] < min(v["range"][0] for v in forward)
    ]  # fmt: skip
    assert sum(v["bytes"] for v in copies) == grads, sorted(v["shape"] for v in copies)
    for v in forward:
        assert low <= v["offset"] and v["offset"] + v["bytes"] <= high, (v, low, high)
    argv = [sys.executable, "-m", "tierax.cli", "simulate", "--maxtext", *keys, "--json"]
    sim = M.json_of(subprocess.run(argv, capture_output=True, text=True, timeout=900, env=M.env()))
    assert sim["breakdown"]["logits_bytes"] == logits  # the rule's loss: the logits' gradient
    assert sim["breakdown"]["peak_phase"] == "layer backward"
    peak = compiled["device_peak_bytes"]
    assert abs(sim["peak_device_bytes"] - peak) <= 0.05 * peak, (sim["peak_device_bytes"], peak)
