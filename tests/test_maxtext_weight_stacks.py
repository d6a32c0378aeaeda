"""XLA:GPU's copies of MaxText's weight stacks
(:mod:`tierax.interop.maxtext_program.weight_stacks`): the rule by hand on MaxText's layouts, and
the terms of a small MaxText MoE config against the buffers XLA:GPU's deviceless compile of
MaxText's own train step holds (slow: one compile)."""

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
    gmm_loop_copy_bytes,
    needs_relayout_copy,
    relayout_copy_bytes,
)

F32, BF16 = 4, 2


def _stack(names, axes, local_shape, mesh, path="decoder/layers/w", dtype="float32"):
    return Stack(
        path=path,
        group="layers",
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
    ("exp", "layers", "embed_moe", "mlp_moe"), ((), (), ("fsdp",), ()), (E, L, D // 4, FF), FSDP4
)
WO = _stack(
    ("exp", "layers", "mlp_moe", "embed_moe"), ((), (), (), ("fsdp",)), (E, L, FF, D // 4), FSDP4
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


class _Config:
    """The MaxText keys :func:`gmm_loop_copy_bytes` reads, as MaxText's base.yml sets them."""

    num_experts = E
    sparse_matmul = True
    megablox = True
    use_tokamax_gmm = False
    dtype = "bfloat16"


def test_the_expert_kernels_loop_copy_is_one_gathered_expert_weight():
    """One layer's largest expert weight, gathered over fsdp, in the compute dtype: mixtral-8x7b-
    h200-full's copy of an all-gather-done, bf16[8, 4096, 14336]."""
    assert gmm_loop_copy_bytes(_Config(), [WI, WO, QUERY], "layers") == E * D * FF * BF16
    assert gmm_loop_copy_bytes(_Config(), [QUERY, NORM], "layers") == 0  # no expert stack
    for key, value in (("megablox", False), ("sparse_matmul", False), ("use_tokamax_gmm", True)):
        other = _Config()
        setattr(other, key, value)
        assert gmm_loop_copy_bytes(other, [WI, WO], "layers") == 0, key


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


@pytest.mark.slow
@pytest.mark.skipif(not maxtext_importable(), reason="MaxText is not installed")
def test_terms_equal_the_buffers_xla_gpu_holds(tmp_path):
    """Slow (a deviceless XLA:GPU compile of MaxText's train step, about a minute; the rule's cases
    stay in the default suite by hand above).  SMALL_MOE on 4 H200s (fsdp=4): the Program's
    ``stack_copy_params`` are the bytes of the entry's relayout copies of the layer stacks, every
    one live at XLA's peak, and the copy of a gathered expert weight its ``moe_backward_bytes`` adds
    is among the values live at the peak."""
    from tierax.interop.maxtext_program import program

    dump = tmp_path / "dump"
    argv = [M.base_yml(), *SMALL_MOE, "--target", "h200", "--devices", "4"]
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
    copies = _entry_relayout_copies(hlo.read_text())
    live = _live_at_peak(report.read_text())

    run = program(M.base_yml(), SMALL_MOE, target="h200", devices=4, microbatch=1, seq=256)
    prog = run.program
    assert run.mesh["fsdp"] == 4
    # gate, query, key, value, out, wi_0, wi_1, wo: every FSDP-sharded stack, the norms not
    assert len(copies) == 8
    assert prog.stack_copy_params * F32 == sum(copies.values())
    assert all(live.get(name) == b for name, b in copies.items())
    # E × D × F in bf16: the layer's expert weight gathered over fsdp; beside it the dispatch's
    # two [tokens × 2 experts a token, D] bf16 buffers (moe_backward_bytes)
    gathered = 4 * 1024 * 1024 * BF16
    dispatch = 2 * (256 * 2) * 1024 * BF16
    assert dict(prog.moe_backward_bytes)["layers"] == dispatch + gathered
    assert any(name.startswith("copy") and b == gathered for name, b in live.items())
