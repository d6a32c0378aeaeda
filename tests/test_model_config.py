"""Model config files, ``--set`` overrides and ``tierax models show`` (issue 7)."""

import dataclasses
import math

import jax
import pytest
import yaml
from flax import nnx

from tierax import plan as plan_lib
from tierax.cli import build_parser, main
from tierax.cli import resolve_model as _resolve_model
from tierax.errors import TieraxError
from tierax.models import (
    NAMED_CONFIGS,
    abstract_model,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    config_to_yaml,
    get_config,
    load_model_config,
)


def traced_param_count(cfg) -> int:
    _, params = nnx.split(abstract_model(cfg))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(params))


def llama_dict(**change):
    return {**config_to_dict(get_config("tiny-llama")), **change}


def deepseek_dict(**change):
    return {**config_to_dict(get_config("tiny-deepseek")), **change}


# --- round trips ----------------------------------------------------------------


@pytest.mark.parametrize("name", list(NAMED_CONFIGS))
def test_every_named_config_round_trips_through_yaml(name):
    cfg = get_config(name)
    d = config_to_dict(cfg)
    assert list(d) == ["family"] + [f.name for f in dataclasses.fields(cfg)]
    again = config_from_dict(yaml.safe_load(config_to_yaml(cfg)), source="test")
    assert again == cfg  # dataclass equality: same family (class) and every field


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-deepseek", "deepseek-v3-671b"])
def test_models_show_output_is_a_model_config_file(tmp_path, name, cli):
    shown = cli("models", "show", name)
    assert shown.returncode == 0, shown.stderr
    f = tmp_path / f"{name}.yaml"
    f.write_text(shown.stdout)
    cfg = get_config(name)
    assert load_model_config(f) == cfg
    r = cli("plans", "--model-config", str(f), "--show", "save-all", "--yaml")
    assert r.returncode == 0, r.stderr
    assert r.stdout == plan_lib.preset("save-all", cfg).to_yaml()


def test_models_show_with_overrides_in_process(capsys, tmp_path):
    assert (
        main(["models", "show", "tiny-llama", "--set", "d_model=128", "--set", "norm_eps=1e-6"])
        == 0
    )
    text = capsys.readouterr().out
    f = tmp_path / "m.yaml"
    f.write_text(text)
    cfg = load_model_config(f)
    assert cfg == dataclasses.replace(
        get_config("tiny-llama"), name="tiny-llama+overrides", d_model=128, norm_eps=1e-6
    )
    # the file plus more overrides, as `plans` resolves it
    args = build_parser().parse_args(["plans", "--model-config", str(f), "--set", "num_layers=2"])
    assert _resolve_model(args) == dataclasses.replace(cfg, num_layers=2)


# --- overrides -------------------------------------------------------------------


def test_overrides_parse_values_and_rename():
    base = get_config("tiny-llama")
    cfg = apply_overrides(
        base,
        [
            "d_model=512",
            "num_layers=4",
            "mlp_dim=2048",
            "num_heads=8",
            "num_kv_heads=8",
            "head_dim=64",
            "vocab_size=32000",
            "norm_eps=1e-5",
            "tie_embeddings=true",
            "rope_theta=10000",
        ],
    )
    assert (cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.vocab_size) == (512, 8, 64, 32000)
    assert cfg.tie_embeddings is True and cfg.norm_eps == 1e-5
    assert isinstance(cfg.rope_theta, float) and cfg.rope_theta == 10000.0
    assert cfg.name == "tiny-llama+overrides"
    assert apply_overrides(base, ["d_model=128", "name=mine"]).name == "mine"
    assert apply_overrides(base, ["d_model=64"]) == base  # no change: the name stays
    assert apply_overrides(base, []) is base
    assert apply_overrides(base, ["d_model=128", "d_model=256"]).d_model == 256  # a later one wins
    assert apply_overrides(base, ["name=405"]).name == "405"  # string fields take the text as is
    twice = apply_overrides(apply_overrides(base, ["d_model=128"]), ["num_layers=2"])
    assert twice.name == "tiny-llama+overrides"


def test_override_changes_traced_param_count_as_predicted_llama():
    base = get_config("tiny-llama")
    cfg = apply_overrides(base, ["d_model=128", "num_layers=2", "mlp_dim=256"])
    assert cfg.param_count() != base.param_count()
    assert traced_param_count(cfg) == cfg.param_count()
    # by hand: 2 layers × (attention + SwiGLU + 2 norms) + untied embedding/head + final norm
    d, h, k, hd, m, v = 128, 4, 2, 16, 256, 256
    assert (
        cfg.param_count()
        == 2 * (d * h * hd + 2 * d * k * hd + h * hd * d + 3 * d * m + 2 * d) + 2 * v * d + d
    )


def test_override_changes_traced_param_count_as_predicted_deepseek():
    base = get_config("tiny-deepseek")
    cfg = apply_overrides(base, ["num_experts=4"])
    traced_base, traced = traced_param_count(base), traced_param_count(cfg)
    assert traced == cfg.param_count()
    # 2 MoE layers each lose 4 routed experts (3·d·expert_mlp_dim) and 4 router columns
    assert traced_base - traced == base.num_moe_layers * 4 * (3 * 64 * 32 + 64)


def test_bench_dtype_is_an_override_of_dtype_only():
    parse = build_parser().parse_args
    cfg = _resolve_model(parse(["bench", "--dtype", "bfloat16"]), ["dtype=bfloat16"])
    assert (
        cfg.dtype == "bfloat16"
        and cfg.param_dtype == "float32"
        and cfg.name == "tiny-llama+overrides"
    )
    assert parse(["bench"]).dtype is None and parse(["bench"]).model_default == "tiny-llama"
    with pytest.raises(SystemExit):
        parse(["bench", "--dtype", "float8"])


def test_bench_document_model_is_the_loadable_config():
    from tierax.measure import bench
    from tierax.mesh import MeshShape

    cfg = apply_overrides(get_config("tiny-deepseek"), ["dtype=bfloat16"])
    doc = bench.bench_document(
        cfg, [], 1.0, command="tierax bench", microbatch=2, seq=16, steps=1, mesh=MeshShape()
    )
    assert doc["model"] == config_to_dict(cfg)
    assert config_from_dict(doc["model"], source="bench record") == cfg


# --- bad input: in process ------------------------------------------------------------


@pytest.mark.parametrize(
    "data, fragments",
    [
        (
            llama_dict(d_modle=64),
            [
                "unknown key 'd_modle'",
                "did you mean 'd_model'",
                "valid keys: " + ", ".join(llama_dict()),
            ],
        ),
        (
            deepseek_dict(mlp_dim=64),
            ["unknown key 'mlp_dim'", "family 'deepseek'", "num_experts_per_tok"],
        ),
        (
            {k: v for k, v in llama_dict().items() if k != "family"},
            ["missing 'family'", "llama, deepseek"],
        ),
        (llama_dict(family="gpt"), ["unknown family 'gpt'", "llama, deepseek"]),
        (
            {k: v for k, v in llama_dict().items() if k != "mlp_dim"},
            ["missing required key mlp_dim"],
        ),
        (llama_dict(d_model="64"), ["d_model expects int", "'64'", "str"]),
        (llama_dict(d_model=64.0), ["d_model expects int", "64.0", "float"]),
        (llama_dict(num_layers=True), ["num_layers expects int", "True", "bool"]),
        (llama_dict(tie_embeddings=1), ["tie_embeddings expects bool", "1", "int"]),
        (llama_dict(tie_embeddings="yes"), ["tie_embeddings expects bool", "'yes'"]),
        (llama_dict(dtype=16), ["dtype expects str", "16"]),
        (llama_dict(norm_eps="tiny"), ["norm_eps expects float", "'tiny'"]),
        (llama_dict(norm_eps=True), ["norm_eps expects float", "True"]),
        (llama_dict(num_kv_heads=3), ["not divisible by num_kv_heads=3"]),
        (
            deepseek_dict(num_experts_per_tok=9),
            ["num_experts_per_tok=9 (top-k) exceeds num_experts=8"],
        ),
        (deepseek_dict(first_dense_layers=5), ["first_dense_layers=5", "num_layers=4"]),
        ([1, 2], ["must be a mapping"]),
    ],
)
def test_bad_config_dicts_are_clear_errors(data, fragments):
    with pytest.raises(TieraxError) as e:
        config_from_dict(data, source="my.yaml")
    msg = str(e.value)
    assert msg.startswith("my.yaml: ")
    for frag in fragments:
        assert frag in msg, (frag, msg)


def test_float_fields_accept_ints_and_yaml_1_1_exponents():
    cfg = config_from_dict(llama_dict(norm_eps="1e-5", rope_theta=10000), source="t")
    assert cfg.norm_eps == 1e-5 and isinstance(cfg.rope_theta, float)
    with pytest.raises(TieraxError, match="norm_eps expects float"):
        config_from_dict(llama_dict(norm_eps=".nan"), source="t")


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["d_model"], ["--set 'd_model'", "KEY=VALUE", "--set d_model=512"]),
        (["=5"], ["KEY=VALUE"]),
        (
            ["d_modl=3"],
            [
                "unknown key 'd_modl'",
                "did you mean 'd_model'",
                "valid keys: name, vocab_size, d_model",
            ],
        ),
        (["q_lora_rank=4"], ["unknown key 'q_lora_rank'", "llama config"]),  # a DeepSeek key
        (["family=deepseek"], ["family cannot be overridden"]),
        (["d_model=3.5"], ["d_model expects int", "3.5"]),
        (["d_model=big"], ["d_model expects int", "'big'"]),
        (["tie_embeddings=2"], ["tie_embeddings expects bool", "2"]),
        (
            ["num_kv_heads=3"],
            ["tiny-llama with --set num_kv_heads=3", "not divisible by num_kv_heads=3"],
        ),
    ],
)
def test_bad_overrides_are_clear_errors(overrides, fragments):
    with pytest.raises(TieraxError) as e:
        apply_overrides(get_config("tiny-llama"), overrides)
    for frag in fragments:
        assert frag in str(e.value), (frag, str(e.value))


def test_deepseek_inconsistent_overrides():
    with pytest.raises(TieraxError, match="exceeds num_experts=4"):
        apply_overrides(get_config("tiny-deepseek"), ["num_experts=4", "num_experts_per_tok=5"])
    with pytest.raises(
        TieraxError, match="first_dense_layers=3 must be between 0 and num_layers=2"
    ):
        apply_overrides(get_config("tiny-deepseek"), ["num_layers=2", "first_dense_layers=3"])


def test_bad_model_config_files(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(TieraxError, match="model config file .*nope.yaml.* does not exist"):
        load_model_config(missing)
    f = tmp_path / "list.yaml"
    f.write_text("- family: llama\n")
    with pytest.raises(TieraxError, match="must be a mapping"):
        load_model_config(f)
    f.write_text("family: llama\nd_model: [\n")
    with pytest.raises(TieraxError, match="not valid YAML"):
        load_model_config(f)
    f.write_text("")
    with pytest.raises(TieraxError, match="must be a mapping"):
        load_model_config(f)
    # hand-written file: YAML 1.1 exponent, fields with defaults left out, no name
    f.write_text(
        "family: llama\nvocab_size: 256\nd_model: 32\nnum_layers: 1\nnum_heads: 2\n"
        "num_kv_heads: 1\nhead_dim: 16\nmlp_dim: 64\nnorm_eps: 1e-6\n"
    )
    cfg = load_model_config(f)
    assert cfg.norm_eps == 1e-6 and cfg.name == "custom-llama" and cfg.rope_theta == 500_000.0


def test_resolve_model_choices(tmp_path):
    parse = build_parser().parse_args
    f = tmp_path / "m.yaml"
    f.write_text(config_to_yaml(get_config("tiny-deepseek")))
    with pytest.raises(TieraxError, match="--model and --model-config both given; use one"):
        _resolve_model(parse(["plans", "--model", "tiny-llama", "--model-config", str(f)]))
    assert _resolve_model(parse(["plans"])) == get_config("tiny-llama")
    assert _resolve_model(parse(["plans", "--model-config", str(f)])) == get_config("tiny-deepseek")
    with pytest.raises(TieraxError, match="unknown model 'tiny-lama'"):
        _resolve_model(parse(["plans", "--model", "tiny-lama"]))
    args = parse(["plans"])
    args.model_default = None  # a verb whose model is required
    with pytest.raises(
        TieraxError, match="no model given; use --model NAME .*tiny-llama.* or --model-config FILE"
    ):
        _resolve_model(args)


def test_models_cli_in_process(capsys):
    assert main(["models", "show"]) == 2
    err = capsys.readouterr().err
    assert "models show needs a NAME" in err and "deepseek-v3-671b" in err
    assert main(["models", "show", "tiny-lama"]) == 2
    assert "unknown model 'tiny-lama'" in capsys.readouterr().err
    assert main(["models", "--set", "d_model=3"]) == 2
    assert "models show NAME" in capsys.readouterr().err
    assert main(["models", "show", "tiny-deepseek", "--json"]) == 0
    import json

    assert json.loads(capsys.readouterr().out) == config_to_dict(get_config("tiny-deepseek"))
    with pytest.raises(SystemExit) as e:
        main(["models", "list"])
    assert e.value.code == 2


# --- bad input: the command line --------------------------------------------------------


def test_cli_bad_model_input_exits_2(tmp_path, cli):
    f = tmp_path / "bad.yaml"
    f.write_text(config_to_yaml(get_config("tiny-llama")).replace("mlp_dim:", "mlp_dimm:"))
    cases = [
        (["plans", "--model", "tiny-llama", "--model-config", str(f)], "use one"),
        (["plans", "--model-config", str(f)], "unknown key 'mlp_dimm'"),
        (["plans", "--model-config", str(tmp_path / "missing.yaml")], "does not exist"),
        (["bench", "--set", "d_model", "--steps", "1"], "expected the form KEY=VALUE"),
        (
            ["models", "show", "tiny-deepseek", "--set", "num_experts_per_tok=9"],
            "exceeds num_experts=8",
        ),
    ]
    for args, fragment in cases:
        r = cli(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert fragment in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr, (args, r.stderr)
