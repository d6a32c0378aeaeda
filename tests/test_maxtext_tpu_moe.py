"""MaxText's routed-expert stacks on a TPU whose scan runs a single trip
(:mod:`tierax.interop.maxtext_program.tpu_moe`): the gathered experts kept from the forward through
the loss, their shard copies not made, the stack's gradients written after its layers' backward —
counted by hand from a tiny GPT-OSS config's shapes on 4 v5p chips (one scanned block of two MoE
layers: one trip), the policy's effect (``full``: both layers' experts; ``minimal``: the last
layer's: by hand, and slow, MaxText's ``minimal`` traced), none of it for a stack that loops, the
cost model's phases over them, one routed layer's experts gathered at a time in the backward under
a policy that saves names, a layer's ``E / expert`` local experts gathered under expert parallelism
(the experts read from MaxText's state), and (slow) the buffers XLA:TPU's compile of the tiny block
holds.
"""

from __future__ import annotations

import dataclasses
import re

import maxtext_cli as M
import pytest
from xla_dump import dump_text as _dump
from xla_dump import temp_values as _temp_values

pytestmark = [M.requires_maxtext, M.programs_once]

# GPT-OSS's block (decoder_block gpt_oss: two layers, sliding-window and full attention, attention
# sinks, biases) at d 256, 4 query / 2 kv heads of 64, 4 experts of 512 (2 per token), vocab 1024.
D, HEADS, KV, HD, F, E, K, VOCAB = 256, 4, 2, 64, 512, 4, 2, 1024
BLOCK = 2  # layers per scanned block (inhomogeneous_layer_cycle_interval)
TINY = [
    "model_name=gpt-oss-20b",
    "override_model_config=true",
    f"base_emb_dim={D}",
    f"base_num_query_heads={HEADS}",
    f"base_num_kv_heads={KV}",
    f"head_dim={HD}",
    f"base_mlp_dim={F}",
    f"base_moe_mlp_dim={F}",
    f"num_experts={E}",
    f"num_experts_per_tok={K}",
    f"vocab_size={VOCAB}",
]
FSDP = 4
BF16, F32 = 2, 4
TOKENS = 64  # emb 256 > 2 × 64: the loss's head gradient after the layers (tpu_terms)
EXPERTS = 3 * E * D * F  # one layer's wi_0, wi_1 [E, D, F] and wo [E, F, D]
BIASES = 2 * E * F + E * D  # and its wi_0_bias, wi_1_bias [E, F] and wo_bias [E, D]


def _program(layers: int, policy: str):
    from tierax.interop.maxtext_program import program

    keys = [*TINY, f"base_num_decoder_layers={layers}", f"remat_policy={policy}"]
    return program(M.base_yml(), keys, target="v5p", devices=FSDP, microbatch=1, seq=TOKENS)


@pytest.fixture(scope="module")
def full():
    """One block of two layers under remat_policy=full: one trip."""
    return _program(BLOCK, "full").program


def _tpu_loss() -> int:
    """tpu_terms' loss (emb > 2 × tokens): the head gathered in bf16, two logits-sized buffers."""
    return BF16 * D * VOCAB + 2 * BF16 * TOKENS * VOCAB


def _outside_late() -> int:
    """tpu_terms' late gradients: the embedding's and head's float32 gradients (sharded over fsdp
    on emb) and the final norm's scale, less the logits-sized buffer held through the layers."""
    return F32 * (2 * VOCAB * D // FSDP + D) - BF16 * TOKENS * VOCAB


def _block_params_per_device(p) -> int:
    """The block's parameters per device, from MaxText's train state: its share of the state's
    parameter bytes (float32) less the embedding, the head and the final norm."""
    return p.inventory.param_bytes // F32 - (2 * VOCAB * D // FSDP + D)


def test_one_block_is_one_trip(full):
    from tierax.interop.maxtext_program import tpu_moe

    assert [(g.name, g.num_layers) for g in full.inventory.groups] == [("layers", 1)]
    assert tpu_moe.single_trip_moe_groups(full.inventory, ["layers"], True) == ["layers"]
    # without scanned layers MaxText's remat prevents CSE: nothing kept
    assert tpu_moe.single_trip_moe_groups(full.inventory, ["layers"], False) == []
    # the same stack looping (two trips, as at 4 layers): none of the terms
    looped = dataclasses.replace(
        full.inventory,
        groups=tuple(dataclasses.replace(g, num_layers=2) for g in full.inventory.groups),
    )
    assert tpu_moe.single_trip_moe_groups(looped, ["layers"], True) == []


def test_full_keeps_both_layers_experts(full):
    """remat_policy=full: both layers' expert kernels gathered in bf16 (E / expert = 4 local
    experts, d and f whole) are held at the loss; their bf16 shards (over fsdp 4) are not copied;
    the block's float32 gradients are late."""
    p = full
    assert p.loss_bytes == _tpu_loss() + BF16 * BLOCK * EXPERTS
    assert p.uncopied_stack_bytes == BF16 * BLOCK * EXPERTS // FSDP
    assert p.late_grad_bytes == _outside_late() + F32 * _block_params_per_device(p)


def test_a_policy_that_saves_names_keeps_the_last_layer():
    """A policy that saves or offloads names: only the last routed-expert layer of the decoder's
    last stack keeps its experts (the block's two layers as MaxText's state lists them); a layer of
    another stack keeps none; the gradients are late all the same."""
    from tierax.interop.maxtext_program import tpu_moe

    # the second layer's experts half the first's, to tell which is kept
    layers = [
        tpu_moe.ExpertLayer("layers", f"decoder/layers/layers_{i}/GptOssMlp", n, n // FSDP)
        for i, n in enumerate((EXPERTS, EXPERTS // 2))
    ]
    sizes = dict(stack_params={"layers": 1000}, compute_itemsize=BF16, grad_itemsize=F32)
    t = tpu_moe.terms(layers, saves_nothing=False, last_group="layers", **sizes)
    last = EXPERTS // 2
    assert (t.kept_gather_bytes, t.uncopied_stack_bytes) == (BF16 * last, BF16 * last // FSDP)
    assert t.late_grad_bytes == F32 * 1000
    other = tpu_moe.terms(layers, saves_nothing=False, last_group="moe_layers", **sizes)
    assert (other.kept_gather_bytes, other.uncopied_stack_bytes) == (0, 0)
    every = tpu_moe.terms(layers, saves_nothing=True, last_group="moe_layers", **sizes)
    assert every.kept_gather_bytes == BF16 * (EXPERTS + last)


def test_a_policy_that_saves_names_gathers_one_layers_experts_at_a_time():
    """Under a policy that saves names the single trip's backward gathers one routed layer's
    experts at a time (the kept last layer's, then each earlier one's again): the group's gathered
    experts are its largest routed layer's; under ``full`` none is given (every layer's kept, the
    layer's own experts as the workspace prices them)."""
    from tierax.interop.maxtext_program import tpu_moe

    layers = [
        tpu_moe.ExpertLayer("layers", f"decoder/layers/layers_{i}/GptOssMlp", n, n // FSDP)
        for i, n in enumerate((EXPERTS // 2, EXPERTS))
    ]
    sizes = dict(stack_params={"layers": 1000}, compute_itemsize=BF16, grad_itemsize=F32)
    t = tpu_moe.terms(layers, saves_nothing=False, last_group="layers", **sizes)
    assert t.gathered_expert_bytes == (("layers", BF16 * EXPERTS),)
    every = tpu_moe.terms(layers, saves_nothing=True, last_group="layers", **sizes)
    assert every.gathered_expert_bytes == ()


def test_cost_model_workspace_takes_the_gathered_experts_given(full):
    """The cost model's layer workspace counts a group's gathered experts as the program gives
    them (Program.gathered_expert_bytes) in place of its layer's own ``E / expert`` local experts
    (here the block's two layers' kernels and biases, expert 1)."""
    from tierax.costmodel import rates as rates_lib
    from tierax.costmodel.fixed import fixed_terms

    rates = rates_lib.target_rates("v5p", "bfloat16")
    own = fixed_terms(full, rates, "lhs")
    one = fixed_terms(
        dataclasses.replace(full, gathered_expert_bytes=(("layers", BF16 * EXPERTS),)),
        rates,
        "lhs",
    )
    block = BF16 * BLOCK * (EXPERTS + BIASES)
    assert own.workspace_bytes - one.workspace_bytes == block - BF16 * EXPERTS


def test_expert_parallelism_gathers_the_local_experts():
    """Under expert parallelism (fsdp 2 × expert 2) each group's routed-expert parameters per layer
    are read from MaxText's state (the block's two layers' kernels and biases over all E experts)
    and a layer's workspace gathers its E / expert local experts, not all E."""
    from tierax.costmodel import rates as rates_lib
    from tierax.costmodel.fixed import _group_workspace, fixed_terms
    from tierax.interop.maxtext_program import program

    keys = [*TINY, f"base_num_decoder_layers={BLOCK}", "remat_policy=full"]
    keys += ["ici_fsdp_parallelism=2", "ici_expert_parallelism=2"]
    p = program(M.base_yml(), keys, target="v5p", devices=FSDP, microbatch=1, seq=TOKENS).program
    (g,) = p.inventory.groups
    assert g.expert_param_count_per_layer == BLOCK * (EXPERTS + BIASES)
    ws = _group_workspace(p, BF16, FSDP, 2, True)["layers"]
    dense = BF16 * (g.layer_param_count - g.expert_param_count_per_layer)
    local = BF16 * g.expert_param_count_per_layer / 2
    assert ws == g.written_residual_bytes_per_layer + dense + local + p.moe_backward("layers")
    assert fixed_terms(p, rates_lib.target_rates("v5p", "bfloat16"), "lhs").workspace_bytes == ws


@pytest.mark.slow
def test_minimal_keeps_the_last_layers_experts():
    """MaxText's remat_policy=minimal on the tiny block: only the last layer's experts are held at
    the loss (the first layer's shards are copied and gathered again in the backward); the
    gradients are late all the same.  (Slow: one more MaxText trace; the default tests check the
    rule's policy branch by hand.)"""
    p = _program(BLOCK, "minimal").program
    assert p.loss_bytes == _tpu_loss() + BF16 * EXPERTS
    assert p.uncopied_stack_bytes == BF16 * EXPERTS // FSDP
    assert p.gathered_expert_bytes == (("layers", BF16 * EXPERTS),)
    assert p.late_grad_bytes == _outside_late() + F32 * _block_params_per_device(p)


def test_cost_model_phases(full):
    """The cost model's phases over the terms: the loss phase the parameters, the optimizer state,
    the loss's bytes with the kept experts and the stack copies less the experts' shards; the layer
    phase the state less every gradient (the block's and the late ones)."""
    from tierax.costmodel import rates as rates_lib
    from tierax.costmodel.fixed import fixed_terms

    p = full
    rates = rates_lib.target_rates("v5p", "bfloat16")
    ft = fixed_terms(p, rates, "lhs")
    copied = fixed_terms(dataclasses.replace(p, uncopied_stack_bytes=0), rates, "lhs")
    assert copied.stack_copy_bytes - ft.stack_copy_bytes == BF16 * BLOCK * EXPERTS // FSDP
    inv = p.inventory
    rest = ft.stack_copy_bytes + ft.fixed_device_bytes
    assert ft.loss_phase_bytes == inv.param_bytes + inv.optimizer_bytes + p.loss_bytes + rest
    # no gradient held in the layers' backward but the loss's held logits-sized buffer
    layer = inv.param_bytes + inv.optimizer_bytes + BF16 * TOKENS * VOCAB
    assert ft.layer_phase_bytes == max(
        layer + ft.workspace_bytes + rest, p.after_backward_bytes + ft.fixed_device_bytes
    )


# ---------------------------------------------------------------------------------------------
# The slow check: XLA:TPU's compile of the tiny block (dumped) holds what the rule names.


@pytest.mark.slow
def test_xla_tpu_keeps_the_gathered_experts(tmp_path):
    """The tiny block's step compiled for 4 v5p chips (compile --maxtext, dumped; libtpu 0.0.52):
    no layer loop; each of the six expert kernels gathered in bf16 in the forward
    (``E × D × F`` elements each) and live from there past the loss (the head's gather) into the
    backward, none gathered in the backward; the kernels' bf16 shards live only around their
    gather, none across the loss.  (Slow: a MaxText compile; the default tests check the rule by
    hand.)"""
    keys = [*TINY, f"base_num_decoder_layers={BLOCK}", "remat_policy=full"]
    keys += ["per_device_batch_size=1", f"max_target_length={TOKENS}"]
    dump = tmp_path / "dump"
    M.compile_dumped([M.base_yml(), *keys, "--target", "v5p", "--devices", str(FSDP)], dump)
    values = _temp_values(dump)
    # no loop over the layers (the megablox kernels' own loops, where XLA keeps any, are inside
    # their shard_map)
    loops = re.findall(r" while\(.*op_name=\"([^\"]*)\"", _dump(dump, ".txt"))
    assert all("shard_map" in op for op in loops), loops
    head = [
        v
        for v in values.values()
        if v["shape"] == f"bf16[{D},{VOCAB}]" and "transpose(jvp())" not in v["op"]
    ]
    assert len(head) == 1, head
    loss = head[0]["range"][0]

    def kernels(rows: int):
        pattern = rf"bf16\[{E},1,({rows},{F}|{F},{rows})\]"
        return [v for v in values.values() if re.fullmatch(pattern, v["shape"])]

    gathered = [v for v in kernels(D) if "convert_element_type" in v["op"]]
    assert not [v for v in gathered if "transpose(jvp())" in v["op"]], gathered
    kept = [v for v in gathered if v["range"][0] < loss < v["range"][1]]
    assert len(kept) == BLOCK * 3, [(v["shape"], v["range"]) for v in gathered]
    assert {v["bytes"] for v in kept} == {BF16 * EXPERTS // 3}
    shards = kernels(D // FSDP)
    assert shards and not [v for v in shards if v["range"][0] < loss < v["range"][1]], shards


@pytest.mark.slow
def test_xla_tpu_gathers_the_local_experts_under_expert_parallelism(tmp_path):
    """The tiny block's step on 4 v5p chips as fsdp 2 × expert 2 (compile --maxtext, dumped):
    each expert kernel is all-gathered over fsdp alone, its E / expert = 2 local experts
    (``bf16[2, 1, D, F]``), never all E: what the cost model's workspace now gathers
    (:func:`tierax.costmodel.fixed._group_workspace` with the experts read from MaxText's state).
    (Slow: a MaxText compile.)"""
    keys = [*TINY, f"base_num_decoder_layers={BLOCK}", "remat_policy=full"]
    keys += ["per_device_batch_size=1", f"max_target_length={TOKENS}"]
    keys += ["ici_fsdp_parallelism=2", "ici_expert_parallelism=2"]
    dump = tmp_path / "dump"
    M.compile_dumped([M.base_yml(), *keys, "--target", "v5p", "--devices", str(FSDP)], dump)
    values = _temp_values(dump)

    def kernels(experts: int):
        pattern = rf"bf16\[{experts},1,({D},{F}|{F},{D})\]"
        return [v for v in values.values() if re.fullmatch(pattern, v["shape"])]

    local = [v for v in kernels(E // 2) if "convert_element_type" in v["op"]]
    forward = [v for v in local if "transpose(jvp())" not in v["op"]]
    assert len(forward) == BLOCK * 3, [(v["shape"], v["op"]) for v in local]
    assert not kernels(E), kernels(E)
    # the cost model's gathered experts: the block's E / expert local experts (kernels and biases)
    from tierax.interop.maxtext_program import program

    p = program(M.base_yml(), keys, target="v5p", devices=FSDP).program
    (g,) = p.inventory.groups
    priced = BF16 * g.expert_param_count_per_layer / 2
    held = sum(v["bytes"] for v in forward)
    assert abs(priced - held) <= 0.01 * held, (priced, held)
