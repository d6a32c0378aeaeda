"""XLA:GPU's copies of MaxText's weight stacks
(:mod:`tierax.interop.maxtext_program.weight_stacks`): the rules by hand on MaxText's layouts (the
relayout copies, the expert kernel's padded weights and copies, a one-layer stack's late
gradients), and the terms of small MaxText MoE configs against the buffers XLA:GPU's deviceless
compile of MaxText's own train step holds (slow: one compile each)."""

from __future__ import annotations

import math
import os
import pathlib
import re
import subprocess
import sys

import maxtext_cli as M
import pytest

from tierax.interop.maxtext_program.config import maxtext_importable
from tierax.interop.maxtext_program.weight_stacks import (
    Stack,
    gmm_weight_bytes,
    needs_relayout_copy,
    relayout_copy_bytes,
    single_trip_grad_params,
)

F32, BF16 = 4, 2


def _stack(
    names, axes, local_shape, mesh, path="decoder/layers/w", dtype="float32", group="layers"
):
    return Stack(
        path=path,
        group=group,
        names=tuple(names),
        axes=tuple(tuple(a) for a in axes),
        local_shape=tuple(local_shape),
        dtype=dtype,
        mesh=tuple(mesh.items()),
    )


# MaxText's stacks (param_scan_axis 1) on fsdp=4, as its abstract state holds them per device: a
# routed expert's wi_0 [E, L, D/4, F] and wo [E, L, F, D/4], the attention's query [D/4, L, H, hd],
# a norm scale [D, L] (replicated).
E, L, D, FF, H, HD = 8, 2, 4096, 14336, 32, 128
FSDP4 = {"fsdp": 4}
WI = _stack(
    ("exp", "layers", "embed_moe", "mlp_moe"),
    ((), (), ("fsdp",), ()),
    (E, L, D // 4, FF),
    FSDP4,
    path="decoder/layers/MoeBlock_0/wi_0",
)
WO = _stack(
    ("exp", "layers", "mlp_moe", "embed_moe"),
    ((), (), (), ("fsdp",)),
    (E, L, FF, D // 4),
    FSDP4,
    path="decoder/layers/MoeBlock_0/wo",
)
QUERY = _stack(
    ("embed_attn", "layers", "q_heads", "kv"), (("fsdp",), (), (), ()), (D // 4, L, H, HD), FSDP4
)
NORM = _stack(("norm", "layers"), ((), ()), (D, L), FSDP4)


def test_every_fsdp_sharded_maxtext_stack_is_copied_whole_in_its_dtype():
    """MaxText's layer axis is its stacks' second: each stack an FSDP axis shards is copied (its
    float32 shard, as stored), the replicated norm scale is not."""
    assert needs_relayout_copy(WI) and needs_relayout_copy(WO) and needs_relayout_copy(QUERY)
    assert not needs_relayout_copy(NORM)
    # by hand: 3 expert stacks (wi_0, wi_1, wo) of E·L·(D/4)·F float32 each, the query's shard
    want = 3 * E * L * (D // 4) * FF * F32 + (D // 4) * L * H * HD * F32
    assert relayout_copy_bytes([WI, WI, WO, QUERY, NORM]) == want
    # mixtral-8x7b-h200-full's wrapped_transpose buffers: 896 MiB per expert stack
    assert relayout_copy_bytes([WI]) == 896 * 2**20


def test_a_layer_leading_stack_is_copied_only_behind_a_wider_dimension():
    """tierax's own layout rule where the layer axis leads (tierax.sharding.gather_layout): a
    layer's slice whose gathered dimension is already major is gathered in place."""
    leading = _stack(("layers", "embed", "mlp"), ((), ("fsdp",), ()), (L, D // 4, FF), FSDP4)
    behind = _stack(("layers", "heads", "embed"), ((), (), ("fsdp",)), (L, H, D // 4), FSDP4)
    single = _stack(("layers", "heads", "embed"), ((), (), ("fsdp",)), (L, 1, D // 4), FSDP4)
    assert not needs_relayout_copy(leading)
    assert needs_relayout_copy(behind)
    assert not needs_relayout_copy(single)


def test_expert_parallelism_keeps_the_experts_dimension_sharded():
    """On expert=4 alone the experts' stacks are split over their experts, not gathered (no copy);
    a non-expert stack whose embed dimension the expert axis shards is gathered over it (copied)."""
    mesh = {"expert": 4}
    wi = _stack(WI.names, (("expert",), (), (), ()), (E // 4, L, D, FF), mesh)
    query = _stack(QUERY.names, (("expert",), (), (), ()), (D // 4, L, H, HD), mesh)
    assert not needs_relayout_copy(wi) and needs_relayout_copy(query)
    # the layer computes with its E/expert local experts, whole D and F
    assert wi.gathered_layer_elements() == (E // 4) * D * FF
    both = _stack(WI.names, (("expert",), (), ("fsdp",), ()), (E // 4, L, D // 2, FF), {
        "expert": 4, "fsdp": 2})  # fmt: skip
    assert needs_relayout_copy(both) and both.gathered_layer_elements() == (E // 4) * D * FF


def test_a_layer_axis_named_after_its_stack_and_one_layer_stacks():
    """DeepSeek's stacks name their layer axis after the stack (``moe_layers``): it is read as the
    layer axis (not gathered); a one-layer stack runs no layer loop and is not copied, the same
    stack of two layers is."""
    names = ("exp", "moe_layers", "embed_moe", "mlp_moe")
    one = _stack(names, ((), (), ("fsdp",), ()), (64, 1, 512, 1408), FSDP4, group="moe_layers")
    two = _stack(names, ((), (), ("fsdp",), ()), (64, 2, 512, 1408), FSDP4, group="moe_layers")
    assert one.layer_axis == 1 and one.gathered_dims() == [2]
    assert one.gathered_layer_elements() == 64 * 2048 * 1408
    assert not needs_relayout_copy(one)
    assert needs_relayout_copy(two)
    assert relayout_copy_bytes([one, two]) == 64 * 2 * 512 * 1408 * F32


class _Config:
    """The MaxText keys the expert kernel's rules read, as MaxText's base.yml sets them."""

    num_experts = E
    sparse_matmul = True
    megablox = True
    use_tokamax_gmm = False
    dtype = "bfloat16"
    scan_layers = True
    wi_tile_fwd_embed_dim = wi_tile_fwd_mlp_dim = 1024
    wi_tile_dlhs_embed_dim = wi_tile_dlhs_mlp_dim = 1024
    wo_tile_fwd_embed_dim = wo_tile_fwd_mlp_dim = 1024
    wo_tile_dlhs_embed_dim = wo_tile_dlhs_mlp_dim = 1024


def _experts(e, d, f, fsdp=4, group="layers", layers=L):
    """wi_0, wi_1 [E, L, D/fsdp, F] and wo [E, L, F, D/fsdp] of a MaxText MoE stack on fsdp."""
    mesh = {"fsdp": fsdp}
    wi = ("exp", group, "embed_moe", "mlp_moe")
    wo = ("exp", group, "mlp_moe", "embed_moe")
    at = f"decoder/{group}/MoeBlock_0/"
    return [
        _stack(wi, ((), (), ("fsdp",), ()), (e, layers, d // fsdp, f), mesh, at + "wi_0",
               group=group),
        _stack(wi, ((), (), ("fsdp",), ()), (e, layers, d // fsdp, f), mesh, at + "wi_1",
               group=group),
        _stack(wo, ((), (), (), ("fsdp",)), (e, layers, f, d // fsdp), mesh, at + "wo",
               group=group),
    ]  # fmt: skip


def test_tile_multiples_hold_two_copies_of_a_gathered_expert_weight():
    """Dimensions that are multiples of the tiles (mixtral-8x7b: E 8, D 4096, F 14336): nothing
    padded; beyond the three gathered weights the workspace counts, two copies of one,
    bf16[8, 4096, 14336] each (mixtral-8x7b-h200-full's copy.572 and copy.548)."""
    assert gmm_weight_bytes(_Config(), [WI, WI, WO, QUERY], "layers") == 2 * E * D * FF * BF16
    assert gmm_weight_bytes(_Config(), [QUERY, NORM], "layers") == 0  # no expert stack
    for key, value in (("megablox", False), ("sparse_matmul", False), ("use_tokamax_gmm", True)):
        other = _Config()
        setattr(other, key, value)
        assert gmm_weight_bytes(other, [WI, WO], "layers") == 0, key


def test_an_mlp_dim_off_the_tiles_is_held_padded_three_times_and_copied_twice():
    """deepseek2-16b's experts (E 64, D 2048 over fsdp 4, F 1408) with base.yml's 1024 tiles: XLA
    holds bf16[64, 2048, 2048] (512 MiB) for each of the three gathered [64, 2048, 1408] (352 MiB)
    and two copies of it: 5 × 512 MiB where the workspace counts 3 × 352 MiB."""
    mib = 2**20
    experts = _experts(64, 2048, 1408, group="moe_layers", layers=1)
    assert gmm_weight_bytes(_Config(), experts, "moe_layers") == 5 * 512 * mib - 3 * 352 * mib
    # a small config's: E 4, D 1024, F 1408 padded to 2048
    small = _experts(4, 1024, 1408)
    padded, gathered = 4 * 1024 * 2048 * BF16, 4 * 1024 * 1408 * BF16
    assert gmm_weight_bytes(_Config(), small, "layers") == 5 * padded - 3 * gathered
    # a D off the tiles pads the embed dimension: D 1536 -> 2048, F 1024 stays
    wide = _experts(4, 1536, 1024)
    assert gmm_weight_bytes(_Config(), wide, "layers") == BF16 * (
        5 * 4 * 2048 * 1024 - 3 * 4 * 1536 * 1024
    )


def test_each_weight_pads_to_its_own_tiles_and_the_larger_pass():
    """wo pads by the ``wo_tile_*`` keys, wi_0/wi_1 by ``wi_tile_*``; where the ``dlhs`` tiles
    pad a weight more than the forward's, the larger is held."""
    experts = _experts(4, 1024, 1408)
    cfg = _Config()
    cfg.wo_tile_fwd_mlp_dim = cfg.wo_tile_dlhs_mlp_dim = 512  # wo's F 1408 -> 1536
    wi, wo = 4 * 1024 * 2048, 4 * 1536 * 1024
    gathered = 3 * 4 * 1024 * 1408
    # padded: wi_0, wi_1 at 2048, wo at 1536; copies: the two largest (both wi)
    want = BF16 * (2 * wi + wo - gathered + 2 * wi)
    assert gmm_weight_bytes(cfg, experts, "layers") == want
    cfg = _Config()
    cfg.wi_tile_dlhs_mlp_dim = 1536  # the dlhs pads wi's F 1408 -> 1536 ... the forward to 2048
    assert gmm_weight_bytes(cfg, experts, "layers") == BF16 * (5 * 4 * 1024 * 2048 - gathered)
    cfg.wi_tile_dlhs_mlp_dim = 3072  # ... now the dlhs's 3072 is the larger
    wi = 4 * 1024 * 3072
    assert gmm_weight_bytes(cfg, experts, "layers") == BF16 * (
        2 * wi + 4 * 1024 * 2048 - gathered + 2 * wi
    )


def test_a_one_layer_routed_expert_stacks_gradients_are_late():
    """A routed-expert group of one layer under MaxText's scan: all its parameters' gradients
    are written after the layer's peak; a group of two layers, a dense group or no scan: none."""
    one = _experts(64, 2048, 1408, group="moe_layers", layers=1)
    two = _experts(8, 4096, 14336)
    params = {"moe_layers": 146_211_968, "layers": 100, "dense_layers": 20_255_232}
    assert single_trip_grad_params(_Config(), one + two, params, ["moe_layers"]) == 146_211_968
    assert single_trip_grad_params(_Config(), one + two, params, ["layers"]) == 0
    assert single_trip_grad_params(_Config(), one, params, ["moe_layers", "layers"]) == 146_211_968
    unscanned = _Config()
    unscanned.scan_layers = False
    assert single_trip_grad_params(unscanned, one, params, ["moe_layers"]) == 0


# A MaxText MoE config small enough to compile in about a minute here, its dimensions multiples of
# the expert kernel's tiles (1024: no padding) and its expert weights larger than the attention's.
SMALL_MOE = [
    "model_name=mixtral-8x7b",
    "override_model_config=true",
    "base_emb_dim=1024",
    "base_mlp_dim=1024",
    "base_moe_mlp_dim=1024",
    "base_num_query_heads=8",
    "base_num_kv_heads=4",
    "head_dim=128",
    "base_num_decoder_layers=2",
    "num_experts=4",
    "vocab_size=1024",
    "remat_policy=full",
]


def _entry_relayout_copies(hlo: str) -> dict[str, int]:
    """The entry computation's fusions of one layer-stacked parameter into a buffer of its size
    (XLA:GPU's relayout copies): value name → bytes."""
    entry = hlo[hlo.index("\nENTRY ") :]
    params = {}
    for name, shape, what in re.findall(
        r"^\s+%(param\.\d+) = f32\[([\d,]+)\]\S* parameter\(\d+\).*?op_name=\"([^\"]*)\"",
        entry,
        re.M,
    ):
        if "['layers']" in what.replace("\\'", "'") and "opt_state" not in what:
            params[name] = math.prod(int(n) for n in shape.split(","))
    out = {}
    for name, shape, operand in re.findall(
        r"^\s+%([\w.\-]+) = f32\[([\d,]+)\]\S* fusion\(%(param\.\d+)\)", entry, re.M
    ):
        n = math.prod(int(x) for x in shape.split(","))
        if params.get(operand) == n:
            out[name] = n * F32
    return out


def _live_at_peak(report: str) -> dict[str, int]:
    """XLA's live-range report: each value live at its peak → bytes."""
    section = report[report.index("(peak):") : report.index("Stack trace breakdown")]
    return {m[0]: int(m[1]) for m in re.findall(r"^\s+(\S+?)\{\d*\}: (\d+) bytes", section, re.M)}


def _compile(tmp_path, keys) -> tuple[str, str]:
    """XLA:GPU's deviceless compile of MaxText's train step for ``keys`` on 4 H200s at microbatch 1,
    256 tokens: its optimized HLO and its live-range report."""
    dump = tmp_path / "dump"
    argv = [M.base_yml(), *keys, "--target", "h200", "--devices", "4"]
    out = subprocess.run(
        [sys.executable, "-m", "tierax.cli", "compile", "--maxtext", *argv, "--microbatch", "1",
         "--seq", "256", "--json"],
        capture_output=True, text=True, timeout=900,
        env={**M.env(), "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump}"},
    )  # fmt: skip
    assert M.json_of(out)["fits"]
    (hlo,) = sorted(pathlib.Path(dump).glob("*jit_train_step*after_optimizations.txt"))
    (report,) = sorted(
        pathlib.Path(dump).glob("*jit_train_step*after_optimizations-live-range.txt")
    )
    return hlo.read_text(), report.read_text()


# The dispatch's two [tokens × 2 experts a token, D] bf16 buffers of SMALL_MOE at 256 tokens
# (moe_backward_bytes' share besides the expert kernel's).
DISPATCH = 2 * (256 * 2) * 1024 * BF16


@pytest.mark.slow
@pytest.mark.skipif(not maxtext_importable(), reason="MaxText is not installed")
def test_terms_equal_the_buffers_xla_gpu_holds(tmp_path):
    """Slow (a deviceless XLA:GPU compile of MaxText's train step, about a minute; the rule's cases
    stay in the default suite by hand above).  SMALL_MOE on 4 H200s (fsdp=4): the Program's
    ``stack_copy_params`` are the bytes of the entry's relayout copies of the layer stacks, every
    one live at XLA's peak, and the two copies of a gathered expert weight its
    ``moe_backward_bytes`` adds are the two copies of that size live at the peak."""
    from tierax.interop.maxtext_program import program

    hlo, report = _compile(tmp_path, SMALL_MOE)
    copies = _entry_relayout_copies(hlo)
    live = _live_at_peak(report)

    run = program(M.base_yml(), SMALL_MOE, target="h200", devices=4, microbatch=1, seq=256)
    prog = run.program
    assert run.mesh["fsdp"] == 4
    # gate, query, key, value, out, wi_0, wi_1, wo: every FSDP-sharded stack, the norms not
    assert len(copies) == 8
    assert prog.stack_copy_params * F32 == sum(copies.values())
    assert all(live.get(name) == b for name, b in copies.items())
    # E × D × F in bf16: the layer's expert weight gathered over fsdp (its tiles' multiple: no pad)
    gathered = 4 * 1024 * 1024 * BF16
    assert dict(prog.moe_backward_bytes)["layers"] == DISPATCH + 2 * gathered
    assert sum(1 for n, b in live.items() if n.startswith("copy") and b == gathered) == 2


# SMALL_MOE with experts of 1408 (MaxText wants the dense MLP the same in an all-MoE model): off
# the kernel's 1024 tiles, padded to 2048.
SMALL_MOE_PADDED = [
    k for k in SMALL_MOE if not k.startswith(("base_mlp_dim", "base_moe_mlp_dim"))
] + ["base_mlp_dim=1408", "base_moe_mlp_dim=1408"]


@pytest.mark.slow
@pytest.mark.skipif(not maxtext_importable(), reason="MaxText is not installed")
def test_padded_expert_weights_equal_the_buffers_xla_gpu_holds(tmp_path):
    """Slow (one compile, about a minute; the padding rule stays in the default suite by hand
    above).  SMALL_MOE_PADDED on 4 H200s (fsdp=4): at XLA's peak the expert weights are held
    padded to bf16[4, 1024, 2048] five times — the three pads and two copies — and none gathered
    unpadded; the Program's ``moe_backward_bytes`` adds those five less the three gathered
    [4, 1024, 1408] the workspace counts."""
    from tierax.interop.maxtext_program import program

    _, report = _compile(tmp_path, SMALL_MOE_PADDED)
    live = _live_at_peak(report)
    padded, gathered = 4 * 1024 * 2048 * BF16, 4 * 1024 * 1408 * BF16
    held = sorted(n.rstrip("0123456789.") for n, b in live.items() if b == padded)
    assert held == ["copy", "copy", "loop_pad_fusion", "loop_pad_fusion", "loop_pad_fusion"]
    assert not [n for n, b in live.items() if n.startswith("all-gather") and b == gathered]

    run = program(M.base_yml(), SMALL_MOE_PADDED, target="h200", devices=4, microbatch=1, seq=256)
    moe = dict(run.program.moe_backward_bytes)["layers"]
    assert moe == DISPATCH + sum(b for b in live.values() if b == padded) - 3 * gathered
