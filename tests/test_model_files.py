"""Config in: MaxText model YAMLs and Hugging Face config.json read as tierax ModelConfigs.

Fixtures: tests/fixtures/maxtext/*.yml are MaxText's own files (source line at their top);
tests/fixtures/hf/*.json hold the published Hugging Face configs' field values (sources in
tests/fixtures/hf/SOURCES.md).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
import yaml

from tierax.cli import main
from tierax.errors import TieraxError
from tierax.interop import maxtext
from tierax.interop.files import load_model_config
from tierax.models import get_config

FIX = pathlib.Path(__file__).parent / "fixtures"
CASES = [
    (FIX / "maxtext" / "deepseek3-671b.yml", "deepseek-v3-671b"),
    (FIX / "maxtext" / "llama3.1-405b.yml", "llama3.1-405b"),
    (FIX / "hf" / "DeepSeek-V3.config.json", "deepseek-v3-671b"),
    (FIX / "hf" / "Llama-3.1-405B.config.json", "llama3.1-405b"),
]


@pytest.mark.parametrize("path, named", CASES, ids=[p.name for p, _ in CASES])
def test_published_configs_equal_our_named_configs(path, named):
    cfg = load_model_config(path)
    ours = get_config(named)
    assert cfg.param_count() == ours.param_count()
    assert cfg.activated_param_count() == ours.activated_param_count()
    assert dataclasses.replace(cfg, name=ours.name) == ours  # every field, not only the count


def test_fields_not_modelled_are_listed(capsys):
    load_model_config(FIX / "hf" / "DeepSeek-V3.config.json")
    err = capsys.readouterr().err
    assert "not modelled" in err and "rope_scaling" in err and "n_group" in err
    assert "num_nextn_predict_layers (the multi-token-prediction module is not built" in err
    load_model_config(FIX / "maxtext" / "deepseek3-671b.yml")
    err = capsys.readouterr().err
    assert "rope_type" in err and "capacity factor 1.0" in err


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-deepseek", "llama3.1-405b"])
def test_maxtext_model_keys_read_back_to_the_same_config(tmp_path, model):
    cfg = get_config(model)
    f = tmp_path / f"{model}.yml"
    f.write_text(yaml.safe_dump(maxtext.model_keys(cfg)))
    back = load_model_config(f)
    expected = dataclasses.replace(cfg, name=f.stem, attention="auto")
    if (
        cfg.family == "deepseek"
    ):  # the capacity factor is a run setting (overrides), not a model key
        expected = dataclasses.replace(expected, capacity_factor=1.0)
    assert back == expected


def _write(tmp_path, name, data):
    f = tmp_path / name
    f.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return str(f)


def _maxtext(**edit):
    data = yaml.safe_load((FIX / "maxtext" / "llama3.1-405b.yml").read_text())
    data.update(edit)
    return {k: v for k, v in data.items() if v is not None}


def _hf(**edit):
    data = json.loads((FIX / "hf" / "Llama-3.1-405B.config.json").read_text())
    data.update(edit)
    return {k: v for k, v in data.items() if v is not None}


@pytest.mark.parametrize(
    "name, data, fragment",
    [
        (
            "m.yml",
            _maxtext(decoder_block="mixtral"),
            "decoder_block 'mixtral' is not supported; valid choices: llama2, deepseek",
        ),
        ("m.yml", _maxtext(sliding_window_size=4096), "unsupported key(s) sliding_window_size"),
        ("m.yml", _maxtext(mlp_activations=["gelu"]), "use [silu, linear]"),
        ("m.yml", _maxtext(enable_dropout=True), "set enable_dropout: false"),
        ("m.yml", _maxtext(base_emb_dim=None), "missing key(s) base_emb_dim"),
        ("m.yml", _maxtext(base_mlp_dim="big"), "base_mlp_dim expects int"),
        (
            "c.json",
            _hf(architectures=["Qwen2ForCausalLM"]),
            "valid choices: LlamaForCausalLM, DeepseekV3ForCausalLM",
        ),
        ("c.json", _hf(sliding_window=4096), "unsupported key(s) sliding_window"),
        ("c.json", _hf(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
        ("c.json", _hf(attention_bias=True), "attention_bias True is not supported"),
    ],
)
def test_bad_configs_exit_2_naming_the_fix(tmp_path, capsys, name, data, fragment):
    f = _write(tmp_path, name, data)
    with pytest.raises(TieraxError, match=None):
        load_model_config(f)
    assert main(["plans", "--model-config", f]) == 2
    err = capsys.readouterr().err
    assert fragment in err
    # a MaxText file tierax's models cannot express points to MaxText's own program
    assert (f"give it as --maxtext {f} instead of --model-config" in err) == name.endswith(".yml")


def test_cli_plans_with_a_maxtext_model_and_emitted_plan(tmp_path, capsys):
    f = str(FIX / "maxtext" / "deepseek3-671b.yml")
    assert (
        main(
            [
                "plans",
                "--model-config",
                f,
                "--show",
                "qkv-offload",
                "--emit",
                "maxtext",
                "--mesh",
                "fsdp=8",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    out = captured.out
    # said, not silent: the file became tierax's own model, and MaxText's program is --maxtext's
    assert "read as tierax's own deepseek model" in captured.err
    assert f"--maxtext {f} plans MaxText's own program" in captured.err
    emitted = tmp_path / "o.yml"
    emitted.write_text(out)
    assert main(["plans", "--model-config", f, "--show", str(emitted), "--yaml"]) == 0
    assert "query_proj: offload" in capsys.readouterr().out


def _ds(**edit):
    data = json.loads((FIX / "hf" / "DeepSeek-V3.config.json").read_text())
    data.update(edit)
    return data


@pytest.mark.parametrize(
    "data, fragment",
    [
        (_hf(num_attention_heads="32", head_dim=None), "num_attention_heads expects int"),
        ({k: v for k, v in _hf().items() if k != "hidden_size"}, "missing key(s) hidden_size"),
        (
            {k: v for k, v in _hf().items() if k != "architectures"},
            'no \'architectures\' key; add "architectures": ["LlamaForCausalLM"]',
        ),
        (
            {k: v for k, v in _ds().items() if k != "architectures"},
            '"architectures": ["DeepseekV3ForCausalLM"]',
        ),
        (_ds(q_lora_rank=None), "q_lora_rank: null (queries without a low-rank projection"),
    ],
)
def test_hf_configs_with_a_wrong_or_missing_key_name_it(tmp_path, capsys, data, fragment):
    f = _write(tmp_path, "config.json", data)
    assert main(["plans", "--model-config", f]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err, err


@pytest.mark.parametrize("theta", ["absent", None])
def test_hf_rope_theta_absent_or_null_takes_hugging_faces_default(tmp_path, capsys, theta):
    data = _hf()
    if theta == "absent":
        del data["rope_theta"]
    else:
        data["rope_theta"] = theta
    cfg = load_model_config(_write(tmp_path, "config.json", data))
    assert cfg.rope_theta == 10_000.0  # transformers' default, not tierax's Llama default
    assert "rope_theta not set: Hugging Face's default 10000 is used" in capsys.readouterr().err


def test_a_directory_where_a_file_is_wanted_is_called_a_directory(tmp_path, capsys):
    from tierax.train import data as D

    model_dir = tmp_path / "Llama-3.1-405B"
    model_dir.mkdir()
    _write(model_dir, "config.json", _hf())
    assert main(["plans", "--model-config", str(model_dir)]) == 2
    err = capsys.readouterr().err
    want = f"is a directory, not a file; give the file in it, e.g. '{model_dir / 'config.json'}'"
    assert want in err, err
    with pytest.raises(
        TieraxError, match="is a directory; give the text, JSONL or Parquet files in it"
    ):
        D.prepare_text(model_dir, tmp_path / "tokens")


def test_only_interop_reads_other_tools_files(tmp_path):
    """The core loaders read tierax's own formats; tierax.interop.files is where another tool's
    model config or plan is recognised (the command line and the training config read through
    it)."""
    from tierax import models
    from tierax import plan as plan_lib
    from tierax.interop import files

    hf = FIX / "hf" / "DeepSeek-V3.config.json"
    with pytest.raises(TieraxError, match="missing 'family'"):
        models.load_model_config(hf)
    assert files.load_model_config(hf) == load_model_config(hf)
    cfg = get_config("tiny-llama")
    plan = plan_lib.preset("qkv-offload", cfg)
    f = tmp_path / "mt.yml"
    f.write_text(maxtext.overrides_yaml(plan, cfg, microbatch=2, seq=64, mesh={"fsdp": 2}))
    with pytest.raises(TieraxError, match="unknown key"):
        plan_lib.load_plan(str(f), cfg)
    back = files.load_plan(str(f), cfg)
    assert plan_lib.resolve(back, cfg) == plan_lib.resolve(plan, cfg)
    assert files.load_plan("qkv-offload", cfg) == plan  # presets and tierax files as before
