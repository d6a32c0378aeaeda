"""XLA:TPU's tiled layouts (:mod:`tierax.hardware.tpu_tiling`): a buffer's bytes from its shape and
layout, by hand; a saved [batch, seq, heads, head_dim] activation's stack with head dim 64 at twice
its logical bytes, the carry and other ranks at their logical bytes; the inventory's named bytes
through the hook; MaxText's program on a TPU target offloading its tiny block's q, k and v (head
dim 64) at the tiled bytes; and (slow) XLA:TPU's compile of
that step: its host temp equals the predicted host bytes, and every tiled buffer of its assignment
has the bytes the rule gives its shape and layout.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import maxtext_cli as M
import pytest

from tierax.costmodel import kept_reads
from tierax.errors import TieraxError
from tierax.hardware.tpu_tiling import stacked_value_bytes, tile_rows, tiled_bytes
from tierax.models.tags import tag
from tierax.tracing.inventory import Inventory, layer_inventory

BF16, F32 = "bfloat16", "float32"


def test_the_minor_dimension_takes_128_lanes_and_the_second_minor_rows_of_8():
    # row-major [24, 200]: 24 rows (three tiles of 8), 200 lanes -> 256
    assert tiled_bytes((24, 200), F32) == 24 * 256 * 4
    assert tiled_bytes((20, 200), BF16) == 24 * 256 * 2  # bf16 pads rows to 8 too, not 16
    # the stack XLA:TPU gave MaxText's offloaded q (layers 3, batch 1, seq 1024, 4 heads of 64),
    # minor to major: head_dim, seq, heads, batch, layers
    assert tiled_bytes((3, 1, 1024, 4, 64), BF16, (4, 2, 3, 1, 0)) == 3 * 4 * 1024 * 128 * 2
    # the scan carry's stack of gpt-oss-20b (emb 2880) seq-minor: nothing padded; emb-minor: 2944
    assert tiled_bytes((2, 1, 1024, 2880), BF16, (2, 3, 1, 0)) == 2 * 1024 * 2880 * 2
    assert tiled_bytes((1024, 2880), BF16) == 1024 * 2944 * 2
    assert tiled_bytes((7,), BF16) == 14  # a vector: its logical bytes


def test_a_short_second_minor_dimension_takes_a_smaller_tile():
    assert [tile_rows(d, 4) for d in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 8]
    # bf16 packs two values a 32-bit word: at least 2 rows; 8-bit values: at least 4
    assert [tile_rows(d, 2) for d in (1, 2, 3)] == [2, 2, 4]
    assert tile_rows(2, 1) == 4
    assert tiled_bytes((3, 256), BF16) == 4 * 256 * 2
    assert tiled_bytes((1, 2880), BF16) == 2 * 2944 * 2
    assert tiled_bytes((64, 2, 64), F32, (2, 1, 0)) == 64 * 2 * 128 * 4


def test_a_layout_that_is_no_order_of_the_dimensions_is_refused():
    with pytest.raises(TieraxError, match=r"no minor-to-major order.*each of 0\.\.2 once"):
        tiled_bytes((2, 3, 4), F32, (0, 1, 1))
    with pytest.raises(TieraxError, match="minor-to-major"):
        tiled_bytes((2, 3), F32, (0, 1, 2))


def test_a_head_dim_of_64_doubles_a_stacked_projection_and_128_or_rank_3_keeps_it():
    # [batch, seq, heads, head_dim]: seq second-minor, so 8 (or 2) kv heads take no tile rows
    assert stacked_value_bytes((1, 1024, 64, 64), BF16) == 64 * 1024 * 128 * 2  # 2 x 8 MiB
    assert stacked_value_bytes((1, 1024, 8, 64), BF16) == 8 * 1024 * 128 * 2
    assert stacked_value_bytes((2, 1024, 2, 64), BF16) == 2 * 2 * 1024 * 128 * 2
    assert stacked_value_bytes((1, 1024, 8, 128), BF16) == 1024 * 8 * 128 * 2
    assert stacked_value_bytes((1, 1000, 8, 128), BF16) == 8 * 1000 * 128 * 2  # 1000 = 125 x 8
    assert stacked_value_bytes((1, 1020, 8, 128), BF16) == 8 * 1024 * 128 * 2
    assert stacked_value_bytes((1, 1024, 12, 128), BF16) == 12 * 1024 * 128 * 2  # heads major
    assert stacked_value_bytes((1, 1024, 2880), BF16) == 1024 * 2880 * 2  # the carry, rank 3
    assert stacked_value_bytes((1, 1024, 4, 2, 64), BF16) == 1024 * 4 * 2 * 64 * 2  # rank 5


def _layer(x, p):
    """A layer saving q [batch, seq, 2 heads, 64] (a residual) and its output (rank 3)."""
    q = tag((x @ p["wq"]).reshape(*x.shape[:2], 2, 64), "query_proj")
    h = tag(jnp.tanh(q.reshape(x.shape[:2] + (128,)) @ p["wo"]), "out_proj")
    return x + h


def test_the_inventory_takes_each_saved_value_at_its_stacked_bytes():
    x = jax.ShapeDtypeStruct((1, 16, 128), jnp.bfloat16)
    p = {k: jax.ShapeDtypeStruct((128, 128), jnp.bfloat16) for k in ("wq", "wo")}
    plain = layer_inventory(_layer, x, p, group="g", num_layers=3)
    tiled = layer_inventory(
        _layer, x, p, group="g", num_layers=3, stacked_bytes=stacked_value_bytes
    )
    by_name = {a.name: a.bytes_per_layer for a in plain.activations}
    tiled_by_name = {a.name: a.bytes_per_layer for a in tiled.activations}
    assert by_name == {"query_proj": 16 * 128 * 2, "out_proj": 16 * 128 * 2}
    assert tiled_by_name == {"query_proj": 2 * 16 * 128 * 2, "out_proj": 16 * 128 * 2}
    # what a layer's workspace counts of q stays its logical bytes (tierax.costmodel.kept_reads)
    q = next(a for a in tiled.activations if a.name == "query_proj")
    assert q.logical_held_bytes_per_layer == 16 * 128 * 2
    assert {a.logical_bytes_per_layer for a in plain.activations} == {0}
    # the residuals with no remat hold the padded q too; the unnamed ones are unchanged
    assert tiled.save_all_bytes_per_layer - plain.save_all_bytes_per_layer == 16 * 128 * 2
    # a kept q (a matmul's output) is read from its stack: the workspace loses its logical bytes
    assert q.read_in_place
    inv = Inventory("t", 1, 16, {}, (tiled,), 0, 0, 0, 0, 0)
    assert kept_reads.read_bytes_per_layer(inv, "g", "query_proj") == 16 * 128 * 2


# MaxText's tiny llama2 block (4 query and 2 kv heads of 64) at 3 layers, q/k/v offloaded.
LAYERS, SEQ, FSDP = 3, 256, 4


def _keys(emb: int = M.D) -> list[str]:
    tiny = [k for k in M.TINY if not k.startswith(("base_num_decoder_layers=", "base_emb_dim="))]
    layers = f"base_num_decoder_layers={LAYERS}"
    return [*tiny, layers, f"base_emb_dim={emb}", "remat_policy=qkv_proj_offloaded"]


def _tiled_host_bytes(layers: int, seq: int) -> int:
    """q, k and v of every layer in bf16, each head's 64 lanes padded to 128."""
    return layers * (M.HEADS + 2 * M.KV) * seq * 128 * 2


@M.requires_maxtext
def test_maxtexts_offloaded_qkv_take_tiled_host_bytes_on_a_tpu():
    """At seq 64: twice the logical bytes (the GPU's: layers x 8 heads x 64 x 64 x 2)."""
    from tierax.interop.maxtext_program import program
    from tierax.plan import Placement, resolve

    mt = program(M.base_yml(), _keys(), target="v5p", devices=FSDP, microbatch=1, seq=64)
    where = resolve(mt.plan, mt.program)
    offloaded = sum(
        a.held_total_bytes
        for a in mt.program.inventory.activations()
        if where[a.group].get(a.name) == Placement.OFFLOAD
    )
    assert offloaded == _tiled_host_bytes(LAYERS, 64) == 2 * LAYERS * 8 * 64 * 64 * 2


_VALUE = re.compile(r"\(size=(\d+),offset=\d+\): (\w+)\[([\d,]*)\]\{([\d,]*):T\(")
_DTYPES = {"bf16": "bfloat16", "f32": "float32", "s32": "int32", "u32": "uint32", "s8": "int8"}


@pytest.mark.slow
@M.requires_maxtext
def test_xla_tpu_holds_the_predicted_host_bytes_and_tiles_every_buffer_so(tmp_path):
    """MaxText's tiny block (emb 264) at 3 layers with q/k/v offloaded, compiled for 4 v5p chips
    (compile --maxtext, dumped; libtpu 0.0.52): its host temp is simulate's host bytes exactly
    (the logical bytes are half), and every tiled value of rank >= 2 in its buffer assignment
    (bf16, f32, s32, u32, s8) has :func:`tiled_bytes` of its shape and layout.  (Slow: a MaxText
    compile; the default tests check the rule by hand and the program's bytes.)"""
    dump = tmp_path / "dump"
    # emb 264, not a multiple of 16: bf16's tiles of 8 rows show (33 of them, not 17 of 16)
    args = [M.base_yml(), *_keys(264), "per_device_batch_size=1", f"max_target_length={SEQ}"]
    args += ["--target", "v5p", "--devices", str(FSDP)]
    compiled = M.compile_dumped(args, dump)
    simulated = M.json_of(M.tierax("simulate", "--maxtext", *args, "--json"))
    assert compiled["host_temp_bytes"] == _tiled_host_bytes(LAYERS, SEQ)
    assert simulated["host_bytes"] == compiled["host_temp_bytes"]
    (assignment,) = dump.glob("*after_optimizations-buffer-assignment.txt")
    checked = 0
    for m in _VALUE.finditer(assignment.read_text()):
        size, dt, shape, layout = m.groups()
        if dt not in _DTYPES or shape.count(",") < 1:
            continue
        dims = tuple(int(d) for d in shape.split(","))
        order = tuple(int(d) for d in layout.split(","))
        assert tiled_bytes(dims, _DTYPES[dt], order) == int(size), (dt, dims, order)
        checked += 1
    assert checked > 100


def _block(x, p):
    """A block of two layers, each tagging its query (the second's twice as wide)."""
    q0 = tag((x @ p["wq0"]).reshape(*x.shape[:2], 2, 64), "query_proj")
    x = x + q0.reshape(x.shape) * x
    q1 = tag((x @ p["wq1"]).reshape(*x.shape[:2], 4, 64), "query_proj")
    return x + (q1.reshape(*x.shape[:2], 256) @ p["wo"])


def test_a_block_tagging_a_name_in_each_layer_keeps_its_largest_value():
    """A host buffer of one value (tierax.interop.maxtext_program.tpu_offload.host_layout) holds
    the block's largest value of the name: the second layer's [1, 16, 4, 64] query, 4 heads x 16
    rows x 128 tiled lanes x 2 bytes, beside the stack's slot of both (2 heads' more)."""
    from tierax.costmodel.terms import host_held_bytes

    x = jax.ShapeDtypeStruct((1, 16, 128), jnp.bfloat16)
    p = {
        "wq0": jax.ShapeDtypeStruct((128, 128), jnp.bfloat16),
        "wq1": jax.ShapeDtypeStruct((128, 256), jnp.bfloat16),
        "wo": jax.ShapeDtypeStruct((256, 128), jnp.bfloat16),
    }
    g = layer_inventory(_block, x, p, group="g", num_layers=2, stacked_bytes=stacked_value_bytes)
    (q,) = [a for a in g.activations if a.name == "query_proj"]
    one, both = 4 * 16 * 128 * 2, 6 * 16 * 128 * 2
    assert (q.host_value_held_bytes, q.host_held_bytes_per_layer) == (one, both)
    assert host_held_bytes(q, 2, "policy") == 2 * both  # a looped scan: its stack
    assert host_held_bytes(q, 2, "policy", (2, 1)) == 2 * both + one  # unrolled
    assert host_held_bytes(q, 1, "policy", (0, 1)) == one  # inlined
