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

from tierax.interop.maxtext_program.config import maxtext_importable

pytestmark = pytest.mark.skipif(
    not maxtext_importable(),
    reason="MaxText is not installed (make venv installs it on Python >= 3.12; make test requires "
    "it)",
)

# d 256, 4 query / 2 kv heads of 64, gated MLP 512, 2 layers, vocab 1024 (MaxText's llama2 block).
D, HEADS, KV, HD, MLP, LAYERS, VOCAB = 256, 4, 2, 64, 512, 2, 1024
TINY = [
    f"base_emb_dim={D}",
    f"base_num_query_heads={HEADS}",
    f"base_num_kv_heads={KV}",
    f"head_dim={HD}",
    f"base_mlp_dim={MLP}",
    f"base_num_decoder_layers={LAYERS}",
    f"vocab_size={VOCAB}",
    "remat_policy=full",
]
MICROBATCH, SEQ, FSDP = 2, 128, 4
BF16, F32 = 2, 4


@pytest.fixture(scope="module")
def run():
    """The tiny config on 4 H200s (MaxText's ici_fsdp_parallelism=-1: fsdp=4), untiled."""
    from tierax.interop.maxtext_program import program

    return program(M.base_yml(), TINY, target="h200", devices=FSDP, microbatch=MICROBATCH, seq=SEQ)


def _layer_params_per_device() -> int:
    """Per layer: q, k, v, out and the gated MLP's three kernels, sharded over fsdp; two norm
    scales, replicated."""
    sharded = D * HEADS * HD + 2 * D * KV * HD + HEADS * HD * D + 3 * D * MLP
    return LAYERS * (sharded // FSDP + 2 * D)


def _outside_params_per_device() -> int:
    """The embedding and the head, sharded over fsdp on emb; the final norm's scale, replicated."""
    return 2 * VOCAB * D // FSDP + D


def test_loss_holds_the_gathered_head_and_compute_dtype_logits(run):
    p = run.program
    assert p.mesh["fsdp"] == FSDP and p.head.tiles == 1
    tokens = MICROBATCH * SEQ
    # the head cast to bf16 and gathered (unsharded), the logits and their gradient in bf16: no
    # float32 logits and no head gradient at the loss
    assert p.loss_bytes == BF16 * D * VOCAB + 2 * BF16 * tokens * VOCAB


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


def _dump(dump: pathlib.Path, suffix: str) -> str:
    found = sorted(dump.glob(f"*jit_train_step*after_optimizations{suffix}"))
    assert found, f"no *jit_train_step*after_optimizations{suffix} in {dump}"
    return found[-1].read_text()


def _temp_values(dump: pathlib.Path) -> dict[str, dict]:
    """The preallocated temp's values: name → shape, bytes, offset, live range, the JAX op."""
    assignment = _dump(dump, "-buffer-assignment.txt")
    block = next(
        b
        for b in re.split(r"^(?=allocation \d+:)", assignment, flags=re.M)
        if re.match(r"allocation \d+: size \d+, page 0, preallocated-temp:", b)
    )
    live = _dump(dump, "-live-range.txt").split("BufferLiveRange:")[1]
    ranges = {n: (int(s), int(e)) for n, s, e in re.findall(r"^\s+(\S+):(\d+)-(\d+)$", live, re.M)}
    ops = {}
    for line in _dump(dump, ".txt").splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*op_name=\"([^\"]*)\"", line)
        if m:
            ops[m.group(1)] = m.group(2)
    out = {}
    for name, size, offset, shape in re.findall(
        r"value: <\d+ (\S+)(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (\w+\[[\d,]*\])", block
    ):
        key = name if "{" in name else name + "{}"
        if key in ranges:
            out[key] = {
                "shape": shape,
                "bytes": int(size),
                "offset": int(offset),
                "range": ranges[key],
                "op": ops.get(name.split("{")[0], ""),
            }
    return out


def _live_at(values: dict, t: int) -> int:
    """Bytes of the temp in use at instruction ``t`` (values sharing an offset counted once)."""
    spans = sorted(
        (v["offset"], v["offset"] + v["bytes"])
        for v in values.values()
        if v["range"][0] <= t <= v["range"][1]
    )
    total, end = 0, -1
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


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
    env = M.env()
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_dump_to={dump}"
    argv = [sys.executable, "-m", "tierax.cli", "compile", "--maxtext", *keys, "--json"]
    M.json_of(subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env))
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
