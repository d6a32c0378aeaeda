"""bench/investigations/head_grad_side.py: its reader of XLA:TPU's side of the head's gradient on
hand-written scheduled HLO, and its record against the current rule
(``tpu_terms.head_grad_schedule``) recomputed from each row's recorded shapes.

Reads HLO text and the record; nothing is compiled or traced."""

from __future__ import annotations

import importlib
import json
import pathlib
import sys
from types import SimpleNamespace

import pytest

from tierax.interop.maxtext_program import tpu_terms

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORD = ROOT / "bench" / "results" / "head_grad_side.json"
EMB, VOCAB, FSDP = 64, 1000, 8
DOT = '"jit(train_step)/transpose(jvp())/dot_general"'

# The record's rows where XLA's side is not the rule's, each with the words of tpu_terms' module
# docstring that document the miss.
MISSES = {
    "qwen3-8b-v6e-12k": "one sequence of 12288 or 16384 tokens a device makes it after the loop",
    "qwen3-8b-v6e-16k": "one sequence of 12288 or 16384 tokens a device makes it after the loop",
}


def _side_module():
    for d in ("bench", "bench/investigations"):
        if str(ROOT / d) not in sys.path:
            sys.path.insert(0, str(ROOT / d))
    return importlib.import_module("head_grad_side")


def _loop(name: str, where: str) -> str:
    return (
        f"  %{name} = (s32[]{{:T(128)}}, bf16[2,4]{{1,0}}) while(%tuple.1), condition=%cond, "
        f'body=%body, metadata={{op_name="jit(train_step)/{where}/while"}}'
    )


def _dot(name: str = "fusion.7", shape: str = f"{EMB},{VOCAB}") -> str:
    return (
        f"  %{name} = bf16[{shape}]{{1,0:T(8,128)(2,1)}} fusion(%a, %b), kind=kOutput, "
        f"calls=%fused_computation.7, metadata={{op_name={DOT} stack_frame_id=1}}"
    )


ALL_REDUCE = (
    f"  %all-reduce.3 = bf16[{EMB},{VOCAB}]{{1,0}} all-reduce(%fusion.7), to_apply=%add, "
    f"metadata={{op_name={DOT}}}"
)
SCATTER_FUSION = (
    f"  %fusion.14 = bf16[{EMB // FSDP},{VOCAB}]{{1,0:T(8,128)(2,1)S(1)}} fusion(%fusion.7), "
    f"kind=kCustom, calls=%all-reduce-scatter.7, metadata={{op_name={DOT}}}"
)
REDUCE_SCATTER = (
    f"  %reduce-scatter.2 = bf16[{EMB // FSDP},{VOCAB}]{{1,0}} reduce-scatter(%fusion.7), "
    f"dimensions={{0}}, to_apply=%add, metadata={{op_name={DOT}}}"
)
# the gradient all-reduced by a fusion, and copied into another layout: no dot
ALL_REDUCE_FUSION = (
    f"  %fusion.20 = bf16[{EMB},{VOCAB}]{{1,0}} fusion(%fusion.7), kind=kCustom, "
    f"calls=%all-reduce.5, metadata={{op_name={DOT}}}"
)
COPY = f"  %copy.5 = bf16[{EMB},{VOCAB}]{{0,1}} copy(%fusion.7), metadata={{op_name={DOT}}}"
# the embedding's gradient: table-shaped, transposed, but no dot
EMBED_GRAD = (
    f"  %scatter.4 = bf16[{VOCAB},{EMB}]{{1,0}} scatter(%z, %i, %g), to_apply=%add, "
    f'metadata={{op_name="jit(train_step)/transpose(jvp())/scatter-add"}}'
)


# a custom call whose config breaks its line at "}}" (as splash attention's does in an entry)
BROKEN = (
    '  %custom-call.3 = bf16[2,4]{1,0} custom-call(%a), custom_call_target="tpu_custom_call", '
    'backend_config={"custom_call_config":{"body":"x"\n}}, metadata={op_name="jit(train_step)/'
    'jvp()/while/body/pallas_call"}'
)


def _hlo(*lines: str) -> str:
    return "\n".join(
        [
            "HloModule jit_train_step, is_scheduled=true",
            "",
            "%body (p: (s32[], bf16[2,4])) -> (s32[], bf16[2,4]) {",
            f"  %inner = bf16[{EMB},{VOCAB}]{{1,0}} fusion(%p), kind=kOutput, calls=%f, "
            f"metadata={{op_name={DOT}}}",
            "}",
            "",
            "ENTRY %main.1_spmd (param.1: f32[8]) -> f32[8] {",
            "  %param.1 = f32[8]{0} parameter(0)",
            _loop("while.1", "jvp()"),
            *lines,
            "  ROOT %tuple.9 = (f32[8]{0}) tuple(%param.1)",
            "}",
            "",
        ]
    )


@pytest.mark.parametrize(
    ("lines", "side"),
    [
        ((_dot(), ALL_REDUCE, _loop("while.2", "transpose(jvp())")), "at the loss"),
        ((_loop("while.2", "transpose(jvp())"), EMBED_GRAD, _dot(), ALL_REDUCE), "after"),
        ((_dot(), SCATTER_FUSION, _loop("while.2", "transpose(jvp())")), "reduce-scattered"),
        ((_dot(), REDUCE_SCATTER, _loop("while.2", "transpose(jvp())")), "reduce-scattered"),
        # made at the loss, reduce-scattered after the loop (TPU7x): at the loss
        ((_dot(), _loop("while.2", "transpose(jvp())"), REDUCE_SCATTER), "at the loss"),
        # made at the loss, then all-reduced or copied after the loop: at the loss
        ((_dot(), _loop("while.2", "transpose(jvp())"), ALL_REDUCE_FUSION), "at the loss"),
        ((_dot(), _loop("while.2", "transpose(jvp())"), COPY), "at the loss"),
        # the entry read past a line broken inside a custom call's config
        ((BROKEN, _loop("while.2", "transpose(jvp())"), _dot()), "after"),
        # the dot fused into the reduce-scatter, unseen in the entry
        ((SCATTER_FUSION, _loop("while.2", "transpose(jvp())")), "reduce-scattered"),
        # a [vocab, emb] dot (the head read transposed)
        ((_dot(shape=f"{VOCAB},{EMB}"), _loop("while.2", "transpose(jvp())")), "at the loss"),
        # two backward loops: the last one decides
        (
            (_loop("while.2", "transpose(jvp())"), _dot(), _loop("while.3", "transpose(jvp())")),
            "at the loss",
        ),
    ],
    ids=["dot-then-loop", "loop-then-dot", "scatter-fusion", "reduce-scatter", "scatter-after",
         "all-reduce-fusion-after", "copy-after", "broken-line", "fused-only", "transposed",
         "two-loops"],
)  # fmt: skip
def test_the_reader_places_the_head_gradient_against_the_backward_loop(lines, side):
    got, why = _side_module().xla_side(_hlo(*lines), EMB, VOCAB, FSDP)
    assert got.startswith(side), (got, why)
    assert "while.2" in why or "while.3" in why


@pytest.mark.parametrize(
    ("lines", "because"),
    [
        ((_dot(), ALL_REDUCE, _loop("while.2", "jvp()")), "no while loop"),
        ((_loop("while.2", "transpose(jvp())"), EMBED_GRAD), "no [emb, vocab] dot"),
        ((_dot(shape=f"{EMB},{VOCAB + 1}"), _loop("while.2", "transpose(jvp())")), "no [emb"),
        (
            (_dot(), _loop("while.2", "transpose(jvp())"), _dot("fusion.8")),
            "on both sides",
        ),
    ],
    ids=["no-backward-loop", "no-dot", "other-shape", "dots-both-sides"],
)
def test_the_reader_says_undecided_where_the_schedule_does_not_tell(lines, because):
    got, why = _side_module().xla_side(_hlo(*lines), EMB, VOCAB, FSDP)
    assert got == "undecided" and because in why, (got, why)


def _rule(row: dict) -> str:
    """The current rule on a row's recorded shapes (the fields head_grad_schedule reads)."""
    config = SimpleNamespace(
        emb_dim=row["emb"],
        vocab_size=row["vocab"],
        dtype=row["dtype"],
        grad_dtype="float32",  # read by the rule's shapes, not by the schedule
        logits_via_embedding=row["tied"],
        use_qk_norm=row["qk_norm"],
    )
    inv = SimpleNamespace(mesh=row["mesh"], microbatch=row["microbatch"], seq=row["seq"])
    return tpu_terms.head_grad_schedule(config, inv, row["target"], row["offloads"])


def test_the_record_is_the_current_rule_and_its_misses_are_the_documented_ones():
    doc = json.loads(RECORD.read_text())
    rows = doc["rows"]
    decided = [r for r in rows if r["xla_side"] != "undecided"]
    assert decided, "no row of the record has a decided side"
    for r in rows:
        assert r["tokens_per_device"] == r["microbatch"] * r["seq"], r["case"]
        assert _rule(r) == r["rule_side"], (r["case"], _rule(r), r["rule_side"])
    for r in decided:
        assert r["agree"] == (r["xla_side"] == r["rule_side"]), r["case"]
        if r["agree"]:
            assert _rule(r) == r["xla_side"], r["case"]
    missed = {r["case"] for r in decided if not r["agree"]}
    assert missed == set(MISSES), missed
    documented = " ".join(tpu_terms.__doc__.split())
    for case, words in MISSES.items():
        assert words in documented, case
