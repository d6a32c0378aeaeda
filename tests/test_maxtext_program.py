"""MaxText's own program as tierax's input (tierax.interop.maxtext_program, ``tierax inventory
--maxtext``): MaxText 0.2.5's model files traced at full size, abstractly, checked against MaxText's
own parameter count, published sizes, the names in MaxText's layer jaxpr and XLA's own FLOP count;
every refusal."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import maxtext_cli as M
import pytest

from tierax.cli import main
from tierax.errors import TieraxError
from tierax.interop.maxtext_program import config as mconfig

pytestmark = M.requires_maxtext

# Representative in the default suite: dense (mistral), DeepSeek's dense + MoE stacks at 671B, a
# scanned block of several attention kinds (gemma3).  The other six under -m slow.
FAST = ("mistral-7b", "deepseek3-671b", "gemma3-12b")
SLOW = (
    "mixtral-8x7b",
    "qwen3-8b",
    "qwen3-30b-a3b",
    "gpt-oss-20b",
    "deepseek2-16b",
    "llama3.1-70b",
)
# Published total parameter counts: the models' Hugging Face cards (mistralai/Mistral-7B-v0.1
# "7.24B params", meta-llama/Llama-3.1-70B "70.6B params") and the DeepSeek-V3 technical report
# (arXiv 2412.19437: 671B total parameters, the multi-token-prediction module not counted).
PUBLISHED = {"mistral-7b": 7.24e9, "llama3.1-70b": 70.6e9, "deepseek3-671b": 671e9}
# The names MaxText's layers tag that are no remat_policy: custom key of base.yml.
NOT_KEYS = {"attention_out", "kv_wa_proj"}
SHAPE = {"microbatch": 1, "seq": 256}


def _configs() -> pathlib.Path:
    import maxtext

    return pathlib.Path(maxtext.__file__).parent / "configs"


def _model_file(name: str) -> str:
    return str(_configs() / "models" / f"{name}.yml")


def _maxtext_params(loaded) -> int:
    """MaxText's own count over MaxText's own abstract parameters (its max_utils helper)."""
    from flax import nnx
    from maxtext.utils import max_utils

    from tierax.interop.maxtext_program import trace

    model = trace._abstract_model(loaded.config, trace._one_device_mesh(loaded.config))
    return int(max_utils.calculate_num_params_from_pytree(nnx.state(model, nnx.Param)))


def _jaxpr_names(loaded) -> dict[str, set[str]]:
    """The checkpoint names in the printed jaxpr of each of MaxText's layers (read from the text,
    not by tierax's jaxpr walk)."""
    import jax
    from flax.linen import partitioning as nn_partitioning

    from tierax.interop.maxtext_program import trace

    config = loaded.config
    model = trace._abstract_model(config, trace._one_device_mesh(config))
    x = jax.ShapeDtypeStruct((loaded.microbatch, loaded.seq, config.emb_dim), config.dtype)
    out = {}
    with nn_partitioning.axis_rules(config.logical_axis_rules), jax.numpy_rank_promotion("allow"):
        for name, stack in trace.decoder_stacks(model.decoder, config):
            fn, params, _ = trace._layer(stack, config)
            text = str(jax.make_jaxpr(fn)(x, params))
            out[name] = set(re.findall(r"\bname\[?\s*name=(\w+)", text)) or set(
                re.findall(r"name=(\w+)\s*\]", text)
            )
    return out


def _base_keys() -> set[str]:
    import yaml

    base = yaml.safe_load((_configs() / "base.yml").read_text(encoding="utf-8"))
    return {k for k, v in base.items() if v in ("remat", "device", "offload")}


def _check_model(name: str) -> None:
    from tierax.interop import maxtext_program
    from tierax.interop.maxtext_program.trace import program_inventory

    with maxtext_program.load(_model_file(name), **SHAPE) as loaded:
        inv = program_inventory(loaded)
        expected = _maxtext_params(loaded)
        names = _jaxpr_names(loaded)
    assert inv.model == name
    total = sum(g.layer_param_count * g.num_layers for g in inv.groups) + inv.embed_param_count
    assert abs(total - expected) <= 0.01 * expected, (total, expected)
    if name in PUBLISHED:
        assert abs(total - PUBLISHED[name]) <= 0.01 * PUBLISHED[name], (total, PUBLISHED[name])
    keys = _base_keys()
    for g in inv.groups:
        got = {a.name for a in g.activations}
        assert got == names[g.name], (g.name, got, names[g.name])
        assert got - keys <= NOT_KEYS, got - keys
        assert {"query_proj", "key_proj", "value_proj", "out_proj"} <= got
        assert all(a.bytes_per_layer > 0 for a in g.activations)
    # One device's state: all of it on one device (no --mesh), in MaxText's dtypes (float32 here).
    assert inv.param_bytes == 4 * expected
    assert inv.optimizer_bytes >= 8 * expected  # AdamW's two float32 moments (+ its step count)


@pytest.mark.parametrize("name", FAST)
def test_model_file_traces(name):
    _check_model(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_model_file_traces_slow(name):
    _check_model(name)


def test_deepseek_groups_follow_maxtext():
    from tierax.interop import maxtext_program

    inv = maxtext_program.inventory(_model_file("deepseek2-16b"), **SHAPE)
    assert [(g.name, g.num_layers) for g in inv.groups] == [("dense_layers", 1), ("moe_layers", 26)]
    moe = {a.name for a in inv.group("moe_layers").activations}
    assert {"moe_mlpwi_0", "moe_mlpwi_1", "moe_mlpwo"} <= moe


SMALL = [
    "decoder_block=mistral",
    *M.TINY,
    "mlp_activations=[silu,linear]",
    "weight_dtype=float32",
    "dtype=float32",
]


def test_forward_flops_match_xla():
    """The layer's forward matmul FLOPs against XLA:CPU's cost analysis of MaxText's layer compiled
    here; XLA also counts elementwise FLOPs (norms, RoPE, softmax, SiLU), so it is at most 5 %
    above."""
    import jax
    from flax.linen import partitioning as nn_partitioning

    from tierax.interop import maxtext_program
    from tierax.interop.maxtext_program import trace

    with maxtext_program.load(str(_configs() / "base.yml"), SMALL, microbatch=2, seq=128) as loaded:
        inv = trace.program_inventory(loaded)
        config = loaded.config
        model = trace._abstract_model(config, trace._one_device_mesh(config))
        ((_, stack),) = trace.decoder_stacks(model.decoder, config)
        fn, params, layers = trace._layer(stack, config)
        x = jax.ShapeDtypeStruct((2, 128, 256), config.dtype)
        rules = nn_partitioning.axis_rules(config.logical_axis_rules)
        with rules, jax.numpy_rank_promotion("allow"):
            cost = jax.jit(fn).lower(x, params).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    (g,) = inv.groups
    assert layers == g.num_layers == 2
    assert g.forward_flops_per_layer <= cost["flops"] <= 1.05 * g.forward_flops_per_layer, (
        g.forward_flops_per_layer,
        cost["flops"],
    )


def test_tensor_axis_divides_the_layer():
    """fsdp=2,tensor=2 at the same sequences per device of the batch axes: every activation of the
    layer half of fsdp=4's (MaxText's rules shard embed, heads and MLP over tensor); per_device
    batch is the microbatch ÷ tensor."""
    from tierax.interop import maxtext_program

    base = str(_configs() / "base.yml")
    one = maxtext_program.inventory(base, SMALL, mesh={"fsdp": 4}, microbatch=2, seq=128)
    two = maxtext_program.inventory(
        base, SMALL, mesh={"fsdp": 2, "tensor": 2}, microbatch=2, seq=128
    )
    assert two.mesh == {"data": 1, "fsdp": 2, "tensor": 2, "expert": 1}
    a, b = one.groups[0], two.groups[0]
    assert {x.name: x.bytes_per_layer // 2 for x in a.activations} == {
        x.name: x.bytes_per_layer for x in b.activations
    }
    assert b.forward_flops_per_layer == a.forward_flops_per_layer / 2


# --- refusals ------------------------------------------------------------------------------------


def _cli(*argv, capsys=None) -> tuple[int, str]:
    rc = main(["inventory", *argv])
    err = capsys.readouterr().err if capsys else ""
    return rc, err


def test_missing_file(capsys, tmp_path):
    rc, err = _cli("--maxtext", str(tmp_path / "nope.yml"), capsys=capsys)
    assert rc == 2 and "no such file" in err


def test_bad_override(capsys):
    rc, err = _cli("--maxtext", _model_file("mistral-7b"), "per_device_batch_size", capsys=capsys)
    assert rc == 2 and "'per_device_batch_size' is no key=value" in err


def test_maxtext_validation_error_names_the_key(capsys):
    rc, err = _cli("--maxtext", _model_file("mistral-7b"), "dropout_rate=lots", capsys=capsys)
    assert rc == 2 and "MaxText refused" in err and "dropout_rate" in err


@pytest.mark.parametrize(
    "key, hint",
    [("per_device_batch_sise=2", " (did you mean per_device_batch_size"), ("zzqqxx=3", ";")],
)
def test_a_key_maxtext_lacks_is_refused_naming_the_closest(capsys, key, hint):
    """Before MaxText's loader (which warns that it ignores the key, then fails listing hundreds of
    its keys): the key, the closest of MaxText's, where its keys are."""
    rc, err = _cli("--maxtext", _model_file("mistral-7b"), key, capsys=capsys)
    assert rc == 2, err
    name = key.partition("=")[0]
    assert f"MaxText has no key '{name}'{hint}" in err and "configs/base.yml" in err
    assert "Ignoring invalid" not in err and len(err) < 600  # no list of MaxText's keys


def test_flag_conflicting_with_key(capsys):
    rc, err = _cli(
        "--maxtext",
        _model_file("mistral-7b"),
        "--microbatch",
        "4",
        "per_device_batch_size=2",
        capsys=capsys,
    )
    assert rc == 2 and "per_device_batch_size=4" in err and "per_device_batch_size=2" in err
    with pytest.raises(TieraxError, match="gradient_accumulation_steps=3"):
        mconfig.merge_flags({"gradient_accumulation_steps": "3"}, mconfig.flag_keys(grad_accum=2))
    with pytest.raises(TieraxError, match="ici_fsdp_parallelism=8"):
        mconfig.merge_flags({"ici_fsdp_parallelism": "4"}, mconfig.flag_keys(mesh={"fsdp": 8}))


def test_pipeline_parallelism_refused(capsys):
    rc, err = _cli(
        "--maxtext", _model_file("mistral-7b"), "ici_pipeline_parallelism=2", capsys=capsys
    )
    assert rc == 2 and "ici_pipeline_parallelism=2" in err and "pipeline" in err


def test_scan_layers_false_refused(capsys):
    rc, err = _cli("--maxtext", _model_file("mistral-7b"), "scan_layers=false", capsys=capsys)
    assert rc == 2 and "scan_layers=false" in err


def test_maxtext_with_model_refused(capsys):
    rc, err = _cli("--maxtext", _model_file("mistral-7b"), "--model", "tiny-llama", capsys=capsys)
    assert rc == 2 and "--maxtext and --model" in err
    rc, err = _cli("--model", "tiny-llama", "per_device_batch_size=2", capsys=capsys)
    assert rc == 2 and "without --maxtext" in err


def test_inventory_with_a_target_traces_that_targets_program(capsys):
    """With --target, inventory --maxtext shows the program simulate and plan price for it (v5p:
    MaxText's splash attention, traced through its stand-in, which keeps the kernel's output
    ``context``); without, MaxText's CPU program (dot_product)."""
    import json

    args = ["--maxtext", str(_configs() / "base.yml"), *SMALL, "--seq", "64", "--devices", "4"]
    assert main(["inventory", *args, "--target", "v5p", "--json"]) == 0
    out, err = capsys.readouterr()
    on_tpu = json.loads(out)
    assert on_tpu["maxtext"]["target"] == "v5p" and on_tpu["maxtext"]["attention"] == "flash"
    assert "stand-in" in err  # the run's notes, on stderr
    assert main(["inventory", *args, "--json"]) == 0
    on_cpu = json.loads(capsys.readouterr().out)
    names = [{a["name"] for g in d["groups"] for a in g["activations"]} for d in (on_tpu, on_cpu)]
    assert "context" in names[0] - names[1]


def test_other_verbs_refuse_maxtext(capsys):
    # inventory, compile, simulate and plan take --maxtext (simulate/plan: test_maxtext_simulate.py)
    for verb in ("bench", "verify"):
        with pytest.raises(SystemExit) as e:
            main([verb, "--maxtext", _model_file("mistral-7b")])
        assert e.value.code == 2
        assert "--maxtext" in capsys.readouterr().err


def test_json_output_is_clean(capsys):
    """stdout holds only the JSON object (MaxText's own prints go to stderr)."""
    import json

    rc = main(
        ["inventory", "--maxtext", str(_configs() / "base.yml"), *SMALL, "--seq", "64", "--json"]
    )
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out)
    assert doc["seq"] == 64 and doc["groups"][0]["name"] == "layers"


def test_without_maxtext_names_what_to_install(tmp_path):
    """MaxText absent (its import blocked in a fresh interpreter: absence, not a mock)."""
    code = (
        "import sys; sys.modules['maxtext'] = None\n"
        "from tierax.cli import main\n"
        f"sys.exit(main(['inventory', '--maxtext', {_model_file('mistral-7b')!r}]))\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 2, r.stderr
    assert "make venv" in r.stderr and "maxtext[tpu]==0.2.5" in r.stderr
