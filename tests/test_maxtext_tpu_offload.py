"""MaxText's step on a TPU where XLA unrolls its layer loop (:mod:`tierax.interop.maxtext_program.
tpu_offload`): a stack of two layers under host offload is noted as a program no deeper model
compiles — not a stack of three, not a step that offloads nothing, not a GPU target — and (slow)
XLA:TPU's compile of the tiny config unrolls the layer loops at that depth and keeps them one
layer deeper.  The host bytes predicted, hand-counted from the cut models' shapes: a slot a layer
for a stack of single layers, one layer's values for a block of two whose scan runs once (GPT-OSS
cut to TINY's widths; slow: XLA:TPU's compile of it holds the same).
"""

from __future__ import annotations

import re

import maxtext_cli as M
import pytest
from xla_dump import dump_text as _dump

from tierax.interop.maxtext_program import tpu_offload
from tierax.models.config import LayerGroup
from tierax.plan import Placement

pytestmark = [M.requires_maxtext, M.programs_once]

FSDP = 4
UNROLLED = tpu_offload.UNROLLED_ITERATIONS


def _keys(layers: int, policy: str) -> list[str]:
    tiny = [k for k in M.TINY if not k.startswith("base_num_decoder_layers=")]
    return [*tiny, f"base_num_decoder_layers={layers}", f"remat_policy={policy}"]


def _notes(layers: int, policy: str) -> tuple[str, ...]:
    from tierax.interop.maxtext_program import program

    return program(
        M.base_yml(), _keys(layers, policy), target="v5p", devices=FSDP, microbatch=1, seq=64
    ).notes


def _unrolled(notes) -> list[str]:
    return [n for n in notes if "unrolls" in n]


def test_a_two_layer_stack_offloading_is_noted():
    (note,) = _unrolled(_notes(2, "qkv_proj_offloaded"))
    assert "layer loop of layers (2 iterations)" in note and "3 iterations or more" in note


def test_three_layers_are_not_noted():
    assert not _unrolled(_notes(3, "qkv_proj_offloaded"))


# The gate itself, over placements as tierax.plan.resolve gives them: no MaxText trace.
def _groups(*layers: int) -> list[LayerGroup]:
    return [LayerGroup(f"g{n}", n, ("query_proj", "mlpwo")) for n in layers]


def _placements(groups, offload: str | None) -> dict:
    return {
        g.name: {
            "query_proj": Placement.OFFLOAD if g.name == offload else Placement.DEVICE,
            "mlpwo": Placement.REMAT,
        }
        for g in groups
    }


def test_the_unrolled_groups_are_the_two_layer_ones_once_anything_is_offloaded():
    groups = _groups(1, 2, 3, 8)
    assert tpu_offload.unrolled_groups(_placements(groups, None), groups) == ()
    # an offload in another group: XLA unrolls the step's 2-iteration loops
    assert tpu_offload.unrolled_groups(_placements(groups, "g8"), groups) == ("g2",)
    assert tpu_offload.unrolled_groups(_placements(groups, "g2"), groups) == ("g2",)
    deep = _groups(3, 8)
    assert tpu_offload.unrolled_groups(_placements(deep, "g3"), deep) == ()


def test_only_a_tpu_target_is_noted():
    groups = _groups(2)
    placements = _placements(groups, "g2")
    assert tpu_offload.unrolled_note(placements, groups, "v5p")
    assert tpu_offload.unrolled_note(placements, groups, "h200") is None


def test_a_stack_whose_scan_runs_once_is_noted_where_it_offloads():
    """XLA:TPU inlines a one-trip stack and packs its offloaded values' host buffers by live range
    (tierax.interop.maxtext_program.tpu_offload): noted for the one-trip group that offloads, on a
    TPU only; a deeper group, or a one-trip group that offloads nothing, is not."""
    groups = _groups(1, 3)
    note = tpu_offload.single_trip_note(_placements(groups, "g1"), groups, "v5p")
    assert "the scan of g1 runs once" in note and "packed by live range" in note
    assert tpu_offload.single_trip_note(_placements(groups, "g3"), groups, "v5p") is None
    assert tpu_offload.single_trip_note(_placements(groups, None), groups, "v5p") is None
    assert tpu_offload.single_trip_note(_placements(groups, "g1"), groups, "h200") is None


def _layer_loops(dump) -> int:
    """The optimized module's while loops (the tiny config is dense: its layer loops alone)."""
    text = _dump(dump, ".txt")
    return sum(1 for line in text.splitlines() if re.search(r" while\(", line))


@pytest.mark.slow
@pytest.mark.parametrize("layers", [UNROLLED, UNROLLED + 1])
def test_xla_tpu_unrolls_the_layer_loops_at_that_depth_only(tmp_path, layers):
    """The tiny config with q/k/v offloaded compiled for 4 v5p chips (compile --maxtext, dumped;
    libtpu 0.0.52): no loop at ``UNROLLED_ITERATIONS`` layers, the forward and backward layer
    loops one layer deeper; the host holds the stacked residuals of every layer, up to one layer's
    more where unrolled.  (Slow: two MaxText compiles; the default tests check the gate.)"""
    dump = tmp_path / "dump"
    keys = [M.base_yml(), *_keys(layers, "qkv_proj_offloaded"), "per_device_batch_size=1"]
    keys += ["max_target_length=256", "--target", "v5p", "--devices", str(FSDP)]
    out = M.compile_dumped(keys, dump)
    assert _layer_loops(dump) == (0 if layers == UNROLLED else 2)
    # one layer's q, k and v in bf16 as XLA:TPU tiles them (the head dim's 64 lanes padded to
    # 128), stacked for every layer; unrolled, up to one layer more in host buffers of its own
    # (whether they share the stacks' offsets is the schedule's)
    per_layer = 2 * 256 * (M.HEADS + 2 * M.KV) * 128
    host = out["host_temp_bytes"]
    if layers == UNROLLED:
        assert layers * per_layer <= host <= (layers + 1) * per_layer
    else:
        assert host == layers * per_layer


# The host bytes (tpu_offload.host_layout): hand-counted from the cut models' shapes.
def _host_bytes(keys: list[str], target: str = "v5p") -> int:
    from tierax import costmodel as cm
    from tierax.interop.maxtext_program import program

    run = program(M.base_yml(), keys, target=target, devices=FSDP, microbatch=1, seq=64)
    rates = cm.target_rates(target, run.program.dtype)
    return cm.simulate(run.plan, run.program, rates, "lhs", run.grad_accum).host_bytes


# One layer's q, k and v, [1, 64, heads, 64] in bf16 as XLA:TPU tiles them (the head dim's 64
# lanes padded to 128).
_PER_LAYER = 2 * 64 * (M.HEADS + 2 * M.KV) * 128


@pytest.mark.parametrize("layers", [1, UNROLLED, UNROLLED + 1])
def test_a_stack_of_single_layers_holds_a_host_slot_a_layer(layers):
    """TINY's llama2 layer: one trip holds its one layer's values (inlined, no stack); two trips
    and three, the stacks' slot a layer (the unrolled program's own buffers are the schedule's)."""
    assert _host_bytes(_keys(layers, "qkv_proj_offloaded")) == layers * _PER_LAYER


# GPT-OSS scans a block of two layers (a sliding-window one and a global one): cut to 2 layers
# at TINY's widths (4 routed experts of 256), its scan runs once.
_GPT_OSS_TINY = [
    "model_name=gpt-oss-20b",
    "override_model_config=true",
    "base_num_decoder_layers=2",
    f"base_emb_dim={M.D}",
    f"base_num_query_heads={M.HEADS}",
    f"base_num_kv_heads={M.KV}",
    f"head_dim={M.HD}",
    "base_mlp_dim=256",
    "base_moe_mlp_dim=256",
    "num_experts=4",
    "num_experts_per_tok=2",
    f"vocab_size={M.VOCAB}",
    "remat_policy=custom",
    "query_proj=offload",
    "key_proj=offload",
    "value_proj=offload",
]


def test_a_block_whose_scan_runs_once_holds_one_layers_values_on_the_host():
    """Inlined, each layer's q, k and v make their host round trip in its forward, one layer's at
    a time: the host holds one layer's, not the block's two (tpu_offload.host_layout)."""
    assert _host_bytes(_GPT_OSS_TINY, "v6e") == _PER_LAYER


def test_the_layout_is_a_tpu_programs_one_trip_groups():
    groups = _groups(1, 2, 3)
    assert tpu_offload.host_layout(groups, "v5p") == (("g1", (0, 1)),)
    assert tpu_offload.host_layout(groups, "h200") == ()


@pytest.mark.slow
def test_xla_tpu_holds_one_layers_values_of_a_block_whose_scan_runs_once(tmp_path):
    """The GPT-OSS cut above compiled for 4 v6e chips (compile --maxtext; libtpu 0.0.52): its host
    temp is one layer's q, k and v as tiled, what simulate predicts.  (Slow: a MaxText compile.)"""
    keys = [M.base_yml(), *_GPT_OSS_TINY, "per_device_batch_size=1", "max_target_length=64"]
    out = M.compile_dumped([*keys, "--target", "v6e", "--devices", str(FSDP)], tmp_path / "dump")
    assert out["host_temp_bytes"] == _PER_LAYER == _host_bytes(_GPT_OSS_TINY, "v6e")
