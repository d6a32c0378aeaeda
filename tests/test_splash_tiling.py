"""tierax's own models under splash attention on a TPU: XLA:TPU lays each saved [batch, seq, heads,
head_dim] value out head_dim-minor (the layout the kernel reads) in 128-lane tiles, on device and
on the host, so a head dim of 64 takes twice its logical bytes.  The inventory sizes the stacks so
(by hand below), the HLO reader sizes an XLA buffer by its tiled layout, and a deviceless v5e
compile of a splash model with head dim 64 holds on the host exactly what simulate predicts, name
by name (the chip check's DeepSeek-style case, value head dim 64, held 64 MiB more than predicted
before: bench/results/tpu_check.json)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys

import pytest

from tierax import plan as plan_lib
from tierax.models import apply_overrides, get_config
from tierax.tracing import inventory as inv_lib
from tierax.xla import hlo

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
# 3 layers, 4 query heads / 2 kv heads of 64, bfloat16; seq 512 (one splash block), microbatch 1
SETS = [
    "d_model=256", "num_heads=4", "num_kv_heads=2", "head_dim=64", "mlp_dim=512",
    "num_layers=3", "vocab_size=1024", "dtype=bfloat16",
]  # fmt: skip
L, B, S, H, KV, HD, BF16 = 3, 1, 512, 4, 2, 64, 2


def test_the_hlo_reader_sizes_a_tiled_buffer_by_its_layout():
    """bf16[3,2,512,8,64] laid out {4,2,3,1,0} in T(8,128) tiles: 64 lanes of 128 used, so 6 MiB
    where the logical array is 3 MiB; the same array untiled (a GPU layout) is its logical bytes,
    and a tile of the second-minor dimension rounds it up to 8 rows."""
    (a,) = hlo.parse_arrays("bf16[3,2,512,8,64]{4,2,3,1,0:T(8,128)(2,1)S(5)}")
    assert a.host and a.tiled and a.minor_to_major == (4, 2, 3, 1, 0)
    assert (a.nbytes, a.assigned_bytes) == (3 * 2 * 512 * 8 * 64 * 2, 3 * 2 * 512 * 8 * 128 * 2)
    (g,) = hlo.parse_arrays("bf16[3,2,512,8,64]{4,3,2,1,0}")
    assert g.assigned_bytes == g.nbytes == 3 * 2**20
    (r,) = hlo.parse_arrays("f32[5,300]{1,0:T(8,128)}")  # rows 5 → 8, lanes 300 → 384
    assert r.assigned_bytes == 8 * 384 * 4
    # the layout sizes the buffer; it does not make it another array
    assert a == hlo.Array("bf16", (3, 2, 512, 8, 64), True)


def _tierax_json(verb: str, args: list[str], cli=None) -> dict:
    """``tierax VERB ARGS`` (ending in --json) in a fresh interpreter (``cli``: in this process, for
    a verb that only traces): its JSON."""
    if cli is not None:
        p = cli(verb, *args)
    else:
        p = subprocess.run(
            [sys.executable, "-m", "tierax.cli", verb, *args],
            capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def _value_bytes(attention: str) -> dict[str, int]:
    cfg = dataclasses.replace(apply_overrides(get_config("tiny-llama"), SETS), attention=attention)
    inv = inv_lib.model_inventory(cfg, B, S)
    (group,) = inv.groups
    return {a.name: a.bytes_per_layer for a in group.activations}


def test_under_splash_the_inventory_stacks_q_k_v_in_128_lanes():
    """Per layer: q [1, 512, 4, 64] bf16 is 256 KiB logical, 512 KiB in 128 lanes; k and v (2
    heads) half that.  Under XLA's attention (no kernel layout) each is its logical bytes, and a
    value that is not [batch, seq, heads, head_dim] is the same under both."""
    splash, plain = _value_bytes("splash"), _value_bytes("xla")
    lanes = 128
    assert splash["query_proj"] == B * S * H * lanes * BF16 == 2 * plain["query_proj"]
    assert splash["key_proj"] == splash["value_proj"] == B * S * KV * lanes * BF16
    assert plain["key_proj"] == B * S * KV * HD * BF16
    assert splash["mlpwi_0"] == plain["mlpwi_0"] == B * S * 512 * BF16


def test_offloaded_values_of_two_or_more_sequences_are_stacked_seq_minor_on_the_host():
    """At microbatch 2 the value projection's host stack is seq-minor: its logical bytes (512
    rows of 64 in 128-lane tiles of seq), while on device it stays head_dim-minor, padded; q and k
    are padded on both; at microbatch 1 the host stack is the device's (XLA's compile below names
    each buffer)."""
    cfg = dataclasses.replace(apply_overrides(get_config("tiny-llama"), SETS), attention="splash")
    for b in (1, 2):
        (group,) = inv_lib.model_inventory(cfg, b, S).groups
        acts = {a.name: a for a in group.activations}
        k, q, v = acts["key_proj"], acts["query_proj"], acts["value_proj"]
        assert v.bytes_per_layer == b * S * KV * 128 * BF16
        assert v.host_held_bytes_per_layer == b * S * KV * (HD if b == 2 else 128) * BF16
        assert q.host_held_bytes_per_layer == q.bytes_per_layer == b * S * H * 128 * BF16
        assert k.host_held_bytes_per_layer == k.bytes_per_layer
        # what a qkv-offload plan puts on the host, as the bench and launch report it
        inv = inv_lib.model_inventory(cfg, b, S)
        by = inv_lib.bytes_by_placement(inv, plan_lib.preset("qkv-offload", cfg), cfg)
        assert by["offload"] == L * sum(a.host_held_bytes_per_layer for a in (q, k, v))
    plain = dataclasses.replace(cfg, attention="xla")
    (group,) = inv_lib.model_inventory(plain, 2, S).groups
    assert all(a.host_bytes_per_layer == 0 for a in group.activations)


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: XLA:TPU cannot compile here")
@pytest.mark.parametrize(
    "b",
    # Microbatch 1 under -m slow: its compile and simulate run the lines microbatch 2's do (a
    # subset of them, with the child's), and the rule's microbatch-1 branch is checked by hand in
    # test_offloaded_values_of_two_or_more_sequences_are_stacked_seq_minor_on_the_host.
    [pytest.param(B, marks=pytest.mark.slow), 2],
)
def test_xla_tpu_holds_the_tiled_host_bytes_simulate_predicts(b, cli):
    """q/k/v offloaded (stored in their own layer: every layer on the host), compiled deviceless
    for one v5e: XLA:TPU's host temp is the tiled sum by hand, which simulate predicts and the
    compile's attribution finds name by name, with no mismatch noted."""
    args = [
        "--model", "tiny-llama", *[a for s in SETS for a in ("--set", s)],
        "--set", "attention=splash", "--plan", "qkv-offload", "--target", "v5e", "--devices", "1",
        "--microbatch", str(b), "--seq", str(S), "--json",
    ]  # fmt: skip

    q, k = L * b * S * H * 128 * BF16, L * b * S * KV * 128 * BF16
    v = k if b == 1 else L * b * S * KV * HD * BF16  # seq-minor from microbatch 2: no lane padding
    compiled, predicted = _tierax_json("compile", args), _tierax_json("simulate", args, cli)
    assert compiled["host_temp_bytes"] == q + k + v == predicted["host_bytes"]
    assert compiled["offloaded_bytes_by_name"] == {
        "query_proj": q, "key_proj": k, "value_proj": v,
    }  # fmt: skip
    assert not [n for n in compiled["notes"] if "mismatch" in n], compiled["notes"]


# Three dense MLA layers, one group: the values' layout is the attention's (the inventory pads them
# where the value head dim is not the query/key one, whatever the MLP: tierax.tracing.inventory.
# _host_stacked_bytes), and XLA:TPU compiles dense layers in less time than MoE ones (a one-layer
# dense group, which the preset recomputes, only added a loop to compile); seq 128, one splash
# block, head_dim-minor and seq-minor still differ in bytes (128 lanes against 64).
MLA_SETS = [
    "d_model=256", "num_layers=3", "first_dense_layers=3", "num_heads=4", "q_lora_rank=128",
    "kv_lora_rank=64", "qk_nope_head_dim=64", "qk_rope_head_dim=64", "v_head_dim=64",
    "dense_mlp_dim=512", "vocab_size=1024", "dtype=bfloat16", "attention=splash",
]  # fmt: skip
MLA_S = 128


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: XLA:TPU cannot compile here")
def test_mla_values_zero_padded_for_the_kernel_stay_head_dim_minor_on_the_host(cli):
    """MLA's values (head dim 64, padded to the query/key head dim 128 for the kernel) are stacked
    head_dim-minor on the host even at microbatch 2, unlike a dense model's: XLA:TPU's host temp of
    deepseek-offload (3 dense MLA layers) is what simulate predicts, value_proj at 128 lanes."""
    args = [
        "--model", "tiny-deepseek", *[a for s in MLA_SETS for a in ("--set", s)], "--plan",
        "deepseek-offload", "--target", "v5e", "--devices", "1", "--microbatch", "2", "--seq",
        str(MLA_S), "--json",
    ]  # fmt: skip

    compiled, predicted = _tierax_json("compile", args), _tierax_json("simulate", args, cli)
    assert compiled["host_temp_bytes"] == predicted["host_bytes"]
    assert set(compiled["offloaded_bytes_by_name"]) >= {"query_proj", "key_proj", "value_proj"}
    assert compiled["offloaded_bytes_by_name"]["value_proj"] == 3 * 2 * MLA_S * 4 * 128 * BF16
    assert not [n for n in compiled["notes"] if "mismatch" in n], compiled["notes"]
