"""MaxText out: overrides emitted from a Plan, read back as the same Plan; one placement per name.

MaxText's keys are checked against ``configs/base.yml`` (AI-Hypercomputer/maxtext
maxtext-v0.2.4 / main e591f30cb), whose custom-policy block is copied below.
"""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
import yaml

from tierax import costmodel as cm
from tierax import names as N
from tierax import plan as P
from tierax.cli import main
from tierax.errors import TieraxError
from tierax.interop import files, maxtext, maxtext_keys
from tierax.models import get_config
from tierax.solving import planner
from tierax.tracing.inventory import Activation, GroupInventory, Inventory
from tierax.tracing.model_program import for_inventory

MB = 2**20
# base.yml's "custom" block, verbatim keys in order (values are all 'remat' but
# decoder_layer_input).
MAXTEXT_BASE_KEYS = """decoder_layer_input indexer_cutoff_threshold context mlpwi mlpwi_0 mlpwi_1
mlpwo moe_mlpwi_0 moe_mlpwi_1 moe_mlpwo query_proj key_proj value_proj kv_proj qkv_proj out_proj
query_wa_proj kv_wa_proj mla_q mla_kv attention_out engram""".split()


def test_keys_are_maxtexts_and_cover_every_tierax_name():
    assert list(maxtext_keys.REMAT_KEYS) == MAXTEXT_BASE_KEYS
    assert set(N.ALL_NAMES) <= set(maxtext_keys.REMAT_KEYS)


def emit(plan, cfg, **kw):
    return maxtext.overrides_yaml(
        plan,
        cfg,
        microbatch=kw.pop("microbatch", 2),
        seq=kw.pop("seq", 64),
        mesh=kw.pop("mesh", {"data": 1, "fsdp": 2, "tensor": 1, "expert": 1}),
        **kw,
    )


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-deepseek"])
@pytest.mark.parametrize("preset", list(P.PRESETS))
def test_emitted_overrides_round_trip_to_the_same_plan(tmp_path, model, preset):
    cfg = get_config(model)
    plan = P.preset(preset, cfg)
    if preset == "deepseek-offload" and model == "tiny-deepseek":
        # Its dense MLP is offloaded in dense layers, but the shared expert (same names) is
        # recomputed in MoE layers.
        with pytest.raises(TieraxError, match="mlpwi_0: offload in dense, remat in moe"):
            emit(plan, cfg)
        return
    f = tmp_path / "mt.yml"
    f.write_text(emit(plan, cfg))
    back = files.load_plan(str(f), cfg)
    if preset == "save-all":
        # MaxText's custom policy has no key for keeping the unnamed intermediates: the file says
        # so, and reads back with them recomputed
        assert "NOT EXPRESSED" in f.read_text()
        plan = dataclasses.replace(
            plan,
            groups={
                g: dataclasses.replace(gp, unnamed=P.Placement.REMAT)
                for g, gp in plan.groups.items()
            },
        )
    # the placements, and the mesh, microbatch and seq it was written for (ici × dcn; per device)
    planned = {"data": 1, "fsdp": 2, "tensor": 1, "expert": 1}
    assert back == dataclasses.replace(
        plan, planned_for=P.PlannedFor(mesh=planned, microbatch=2, seq=64)
    )
    data = yaml.safe_load(f.read_text())
    assert data["remat_policy"] == "custom" and data["base_config"] == "base.yml"
    assert (
        data["per_device_batch_size"] == 2
        and data["max_target_length"] == 64
        and data["scan_layers"] is True
    )
    assert data["ici_fsdp_parallelism"] == 2 and data["ici_data_parallelism"] == 1
    assert {
        k: data[k]
        for k in maxtext_keys.REMAT_KEYS
        if k in N.ALL_NAMES and k in P.resolve(plan, cfg)[cfg.layer_groups()[0].name]
    } == {n: p.value for n, p in P.resolve(plan, cfg)[cfg.layer_groups()[0].name].items()}
    assert all(
        data[k] == "remat"
        for k in maxtext_keys.NO_COUNTERPART
        if k in maxtext_keys.REMAT_KEYS and k != "context"
    )
    # context and attention_out name one tensor on GPU and TPU
    assert data["hardware"] == "gpu" and data["context"] == data["attention_out"]
    assert not set(maxtext_keys.RELEASE_0_2_5_KEYS) & set(
        data
    )  # MaxText 0.2.4 and main refuse them


def test_model_schedule_moe_and_env_keys():
    cfg = get_config("deepseek-v3-671b")
    text = emit(
        P.preset("qkv-offload", cfg),
        cfg,
        schedule="lhs-pipelined",
        target="gb200",
        budget_bytes=150 * 2**30,
        capacity_bytes=186e9,
        host_bytes=80e9,
        mesh={"data": 1, "fsdp": 64, "tensor": 1, "expert": 2},
    )
    d = yaml.safe_load(text)
    assert (
        d["decoder_block"],
        d["attention_type"],
        d["base_emb_dim"],
        d["base_num_decoder_layers"],
    ) == ("deepseek", "mla", 7168, 61)
    assert (
        d["first_num_dense_layers"],
        d["num_experts"],
        d["shared_experts"],
        d["base_moe_mlp_dim"],
    ) == (3, 256, 1, 2048)
    assert (
        d["sparse_matmul"] is False and d["capacity_factor"] == 1.0 and d["num_vocab_tiling"] == 1
    )
    assert d["ici_expert_parallelism"] == 2 and d["hardware"] == "gpu"
    assert (
        d["key_proj"] == d["value_proj"] == d["query_proj"] == "offload"
        and d["moe_mlpwi_0"] == "remat"
    )
    assert "--xla_gpu_enable_pipelined_host_offloading=true" in text
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.87" in text  # 150 GiB / 186 GB, rounded up
    assert "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB=800" in text  # 80 GB × 8 devices per process × 1.25


def test_a_plan_that_differs_by_group_is_refused_naming_the_conflict(tmp_path):
    cfg = get_config("tiny-deepseek")
    plan = P.Plan(
        "split",
        {
            "dense": P.GroupPlan({N.QUERY_PROJ: "offload", N.DECODER_LAYER_INPUT: "device"}),
            "moe": P.GroupPlan({N.QUERY_PROJ: "device", N.DECODER_LAYER_INPUT: "device"}),
        },
    )
    with pytest.raises(TieraxError, match=r"query_proj: offload in dense, device in moe"):
        emit(plan, cfg)
    f = tmp_path / "split.yaml"
    f.write_text(plan.to_yaml())
    assert main(["plans", "--model", "tiny-deepseek", "--show", str(f), "--emit", "maxtext"]) == 2


@pytest.mark.parametrize(
    "edit, fragment",
    [
        ({"context": "offload", "hardware": "cpu"}, "context: offload has no tierax counterpart"),
        ({"query_proj": "keep"}, "not a MaxText placement"),
        ({"decoder_layer_input": "remat"}, "decoder_layer_input cannot be remat"),
        ({"moe_x_sorted": "device"}, "moe_x_sorted: device has no tierax counterpart"),
    ],
)
def test_bad_override_files_exit_2(tmp_path, capsys, edit, fragment):
    cfg = get_config("tiny-llama")
    data = yaml.safe_load(emit(P.preset("minimal", cfg), cfg))
    data.update(edit)
    f = tmp_path / "bad.yml"
    f.write_text(yaml.safe_dump(data))
    assert main(["plans", "--model", "tiny-llama", "--show", str(f)]) == 2
    assert fragment in capsys.readouterr().err


def test_cli_emits_and_reads_back(tmp_path, capsys):
    out = tmp_path / "mt.yml"
    assert (
        main(
            [
                "plans",
                "--model",
                "tiny-llama",
                "--show",
                "qkv-offload",
                "--emit",
                "maxtext",
                "--mesh",
                "fsdp=4",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "ici_fsdp_parallelism: 4" in printed and "query_proj: offload" in printed
    out.write_text(printed)
    assert main(["plans", "--model", "tiny-llama", "--show", str(out), "--yaml"]) == 0
    assert P.Plan.from_yaml(capsys.readouterr().out) == dataclasses.replace(
        P.preset("qkv-offload", get_config("tiny-llama")),
        planned_for=P.PlannedFor(
            mesh={"data": 1, "fsdp": 4, "tensor": 1, "expert": 1}, microbatch=8, seq=64
        ),
    )
    assert main(["plans", "--model", "tiny-llama", "--show", "minimal", "--emit", "tpu"]) == 2
    assert "--emit 'tpu' is not supported; choose one of: maxtext" in capsys.readouterr().err


def test_plan_for_maxtext_emits_a_uniform_plan_and_reports_the_cost(tmp_path, capsys):
    out = tmp_path / "planned.yml"
    args = [
        "plan",
        "--model",
        "tiny-deepseek",
        "--target",
        "h200",
        "--microbatch",
        "2",
        "--seq",
        "32",
        "--for",
        "maxtext",
        "--emit",
        "maxtext",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "MaxText restriction (one placement per name across layer groups)" in printed
    cfg = get_config("tiny-deepseek")
    plan = files.load_plan(str(out), cfg)
    assert not maxtext.conflicts(plan, cfg)
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.95" in out.read_text()


@pytest.mark.parametrize("target", ["v5e", "v5p", "v6e"])
def test_tpu_targets_emit_a_tpu_config_without_gpu_settings(capsys, target):
    for argv in (
        ["plans", "--model", "tiny-llama", "--show", "qkv-offload", "--emit", "maxtext"],
        ["plan", "--model", "tiny-llama", "--microbatch", "2", "--seq", "32", "--emit", "maxtext"],
    ):
        assert main([*argv, "--target", target]) == 0, argv
        text = capsys.readouterr().out
        data = yaml.safe_load(text)
        assert data["hardware"] == "tpu", argv
        exports = [ln for ln in text.splitlines() if ln.startswith("#   export")]
        # libtpu's options for the step the plan was modelled on, and nothing of XLA:GPU's
        assert len(exports) == 1 and "LIBTPU_INIT_ARGS=" in exports[0], (argv, exports)
        assert "--xla_tpu_enable_windowed_einsum_for_reduce_scatter=false" in exports[0]
        assert "xla_gpu" not in text and "XLA_PYTHON_CLIENT" not in "\n".join(exports), argv


def test_a_mesh_the_model_cannot_take_is_refused_when_emitting(capsys):
    argv = ["plans", "--model", "tiny-llama", "--show", "qkv-offload", "--emit", "maxtext"]
    assert main([*argv, "--mesh", "tensor=4"]) == 2
    err = capsys.readouterr().err
    assert "num_kv_heads=2 is not divisible by tensor=4" in err and "ici_tensor" not in err
    assert main([*argv, "--mesh", "tensor=2"]) == 0
    assert "ici_tensor_parallelism: 2" in capsys.readouterr().out


def test_overrides_written_for_another_model_are_refused_as_its_plan(tmp_path, capsys):
    deepseek, llama = get_config("tiny-deepseek"), get_config("tiny-llama")
    f = tmp_path / "ds.yml"
    f.write_text(emit(P.preset("remat-full", deepseek), deepseek))
    assert main(["plans", "--model", "tiny-llama", "--show", str(f)]) == 2
    err = capsys.readouterr().err
    assert "MaxText overrides for another model than tiny-llama" in err
    assert "decoder_block 'deepseek' (here 'llama2')" in err and "delete its model keys" in err
    # The fix the message names: without model keys the file is placements only.
    data = yaml.safe_load(f.read_text())
    keys = set(maxtext_keys.model_keys(deepseek)) | set(maxtext_keys.model_keys(llama))
    f.write_text(yaml.safe_dump({k: v for k, v in data.items() if k not in keys}))
    assert files.load_plan(str(f), llama) == P.Plan.from_dict(
        {
            "plan": "ds",
            "description": f"read from MaxText overrides {f}",
            "groups": {
                "decoder": {
                    "default": "remat",
                    **{n: "remat" for n in llama.layer_groups()[0].activations},
                    N.DECODER_LAYER_INPUT: "device",
                }
            },
            # the mesh, per-device batch and sequence length stay: they are no model keys
            "planned_for": {"mesh": {"data": 1, "fsdp": 2}, "microbatch": 2, "seq": 64},
        }
    )


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--mesh", "fsdp=4"], "--mesh only sizes the config --emit writes"),
        (["--target", "v5p", "--seq", "32"], "--target, --seq only size the config --emit writes"),
        (["--yaml", "--emit", "maxtext"], "--yaml and --emit both print the plan; give one"),
    ],
)
def test_plans_refuses_options_it_would_ignore(capsys, extra, fragment):
    assert main(["plans", "--model", "tiny-llama", "--show", "minimal", *extra]) == 2
    assert fragment in capsys.readouterr().err
    assert main(["plans", "--emit", "maxtext"]) == 2
    assert "add --show PLAN" in capsys.readouterr().err


def test_for_maxtext_names_the_mechanism_and_what_plan_without_for_predicts(capsys):
    base = ["plan", "--model", "tiny-deepseek", "--microbatch", "2", "--seq", "32", "--json"]
    assert main(base) == 0
    own = json.loads(capsys.readouterr().out)["predicted"]["step_time_s"]
    assert main([*base, "--for", "maxtext"]) == 0
    (note,) = json.loads(capsys.readouterr().out)["notes"]
    assert "with XLA's offload policy (mechanism: policy, what MaxText runs)" in note, note
    assert f"without --for plans tierax's prefetching scan: {own * 1e3:.4g} ms" in note, note


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-deepseek"])
def test_every_name_in_every_placement_is_written_and_read_back(tmp_path, model):
    """Not only the presets' combinations: each activation name alone in each placement."""
    cfg = get_config(model)
    names = list(dict.fromkeys(n for g in cfg.layer_groups() for n in g.activations))
    f = tmp_path / "one.yml"
    for name, placement in itertools.product(names, P.Placement):
        groups = {}
        for g in cfg.layer_groups():
            placements = {N.DECODER_LAYER_INPUT: P.Placement.DEVICE}
            if name in g.activations:
                placements[name] = placement
            groups[g.name] = P.GroupPlan(placements, P.Placement.REMAT)
        plan = P.Plan("one", groups)
        if name == N.DECODER_LAYER_INPUT and placement is P.Placement.REMAT:
            with pytest.raises(TieraxError, match="recomputes decoder_layer_input"):
                emit(plan, cfg)
            continue
        f.write_text(emit(plan, cfg))
        data = yaml.safe_load(f.read_text())
        expected = {
            n: P.Placement.DEVICE if n == N.DECODER_LAYER_INPUT else P.Placement.REMAT
            for n in names
        } | {name: placement}
        written = {n: data[n] for n in names}
        assert written == {n: p.value for n, p in expected.items()}, (name, placement)
        back = files.load_plan(str(f), cfg)
        assert P.resolve(back, cfg) == P.resolve(plan, cfg), (name, placement)


# --- the one-placement-per-name constraint against brute force ------------------------------------

CFG = get_config("tiny-deepseek")
SHARED = (N.QUERY_PROJ, N.KEY_PROJ)
NAMES = {"dense": SHARED + (N.MLPWI_0, N.MLPWO), "moe": SHARED + (N.MOE_MLPWI_0, N.MOE_MLPWI_1)}
ORDER = [(g, n) for g in ("dense", "moe") for n in NAMES[g]]


def inventory(dense_items, moe_items) -> Inventory:
    groups = []
    for gname, layers, items in (("dense", 3, dense_items), ("moe", 5, moe_items)):
        acts = [Activation(gname, N.DECODER_LAYER_INPUT, 8 * MB, layers, 0.0)]
        named = zip(NAMES[gname], items, strict=False)
        acts += [Activation(gname, n, b, layers, f) for n, (b, f) in named]
        groups.append(
            GroupInventory(
                gname,
                layers,
                tuple(acts),
                8 * MB,
                8 * MB + sum(b for b, _ in items) + 4 * MB,
                0.5e9,
                8e9,
                layer_param_count=1000,
            )
        )
    return Inventory(
        "synthetic",
        4,
        64,
        {"data": 1, "fsdp": 1},
        tuple(groups),
        300 * MB,
        300 * MB,
        600 * MB,
        4 * 64 * CFG.vocab_size * 4,
        1000,
    )


RATES = cm.Rates("synthetic", 1e12, 4e12, 20e9, 16e9, 450e9, 10**15, 10**15, True)
# attention cheap to recompute in dense layers, dear in MoE layers: the groups disagree unrestricted
CASES = [
    (
        inventory(
            [(32 * MB, 0.1e9), (16 * MB, 0.05e9), (48 * MB, 1e9), (8 * MB, 0.05e9)],
            [(32 * MB, 6e9), (16 * MB, 5e9), (96 * MB, 4e9), (96 * MB, 4e9)],
        ),
        "lhs",
        2400 * MB,
        10**15,
    ),
    (
        inventory(
            [(32 * MB, 3e9), (16 * MB, 0.05e9), (48 * MB, 1e9), (8 * MB, 0.05e9)],
            [(32 * MB, 0.2e9), (16 * MB, 5e9), (96 * MB, 4e9), (96 * MB, 4e9)],
        ),
        "serial",
        2300 * MB,
        800 * MB,
    ),
]


def brute(inv, schedule, budget, host_budget, uniform):
    best = None
    for codes in itertools.product(list(P.Placement), repeat=len(ORDER)):
        pl = dict(zip(ORDER, codes, strict=False))
        if uniform and any(pl[("dense", n)] is not pl[("moe", n)] for n in SHARED):
            continue
        pred = cm.evaluate(
            pl, for_inventory(CFG, inv), RATES, schedule, "policy"
        )  # MaxText runs XLA's offload policy
        if pred.peak_device_bytes <= budget and pred.host_bytes <= host_budget:
            best = pred.step_time_s if best is None else min(best, pred.step_time_s)
    return best


@pytest.mark.parametrize("case", range(len(CASES)))
def test_one_placement_per_name_is_optimal_among_uniform_plans(case):
    inv, schedule, budget, host_budget = CASES[case]
    kw = dict(
        schedule=schedule, budget_bytes=budget, host_budget_bytes=host_budget, mechanism="policy"
    )
    uniform = planner.plan(for_inventory(CFG, inv), RATES, one_placement_per_name=True, **kw)
    free = planner.plan(for_inventory(CFG, inv), RATES, **kw)
    r = P.resolve(uniform.plan, CFG)
    assert all(r["dense"][n] is r["moe"][n] for n in SHARED)
    assert uniform.predicted.step_time_s == pytest.approx(
        brute(inv, schedule, budget, host_budget, True), rel=1e-6
    )
    assert free.predicted.step_time_s == pytest.approx(
        brute(inv, schedule, budget, host_budget, False), rel=1e-6
    )
    assert uniform.predicted.step_time_s > free.predicted.step_time_s * (
        1 + 1e-6
    )  # the restriction binds here
    assert maxtext.conflicts(free.plan, CFG)


@pytest.mark.parametrize(
    "attention, key", [("cudnn", "cudnn_flash_jax"), ("xla", "dot_product"), ("blockwise", None)]
)
def test_emitted_attention_kernel_matches_the_step(attention, key):
    # cuDNN through JAX in tierax is MaxText's cudnn_flash_jax; blockwise has no MaxText kernel
    # (said, not guessed).
    cfg = get_config("tiny-llama")
    cfg = dataclasses.replace(cfg, dtype="bfloat16", attention=attention)
    text = emit(P.preset("remat-full", cfg), cfg)
    data = yaml.safe_load(text)
    assert data.get("attention") == key
    assert ("has no MaxText kernel" in text) == (key is None)


@pytest.mark.parametrize(
    "hardware, context, attention_out, read",
    [
        # MaxText's default hardware is tpu: splash attention's residuals
        (None, "offload", None, "offload"),
        ("tpu", "device", "remat", "device"),
        ("gpu", "offload", "device", "device"),  # one tensor: the placement that keeps more of it
        ("gpu", "remat", "offload", "offload"),
        ("gpu_multiprocess", "offload", None, "offload"),  # MaxText's multi-host GPU hardware
        ("cpu", "remat", "offload", "offload"),  # dot-product attention: context names nothing
    ],
)
def test_context_reads_as_attention_out_on_tpu_and_gpu(
    tmp_path, hardware, context, attention_out, read
):
    """MaxText 0.2.5 names the fused attention kernel's output and log-sum-exp ``context`` (TPU
    splash attention, GPU cuDNN flash attention) and the same output ``attention_out``: a MaxText
    estimator row with ``context: offload`` is tierax's attention_out offloaded."""
    cfg = get_config("tiny-llama")
    data = {"remat_policy": "custom", "decoder_layer_input": "device", "context": context}
    if hardware:
        data["hardware"] = hardware
    if attention_out:
        data["attention_out"] = attention_out
    f = tmp_path / "row.yml"
    f.write_text(yaml.safe_dump(data))
    placements = P.resolve(files.load_plan(str(f), cfg), cfg)["decoder"]
    assert placements[N.ATTENTION_OUT].value == read
    assert placements[N.QUERY_PROJ].value == "remat"


def test_emit_for_a_tpu_target_says_tpu_and_context_follows_attention_out():
    cfg = get_config("tiny-llama")
    placements = {N.ATTENTION_OUT: "offload", N.DECODER_LAYER_INPUT: "device"}
    plan = P.Plan("ao", {"decoder": P.GroupPlan(placements)})
    data = yaml.safe_load(emit(plan, cfg, target="v5p"))
    assert data["hardware"] == "tpu" and data["context"] == data["attention_out"] == "offload"
    # dot-product attention: no context
    assert yaml.safe_load(emit(plan, cfg, target="cpu"))["context"] == "remat"
    # every GPU and TPU target: context follows attention_out
    for target in ("h100", "gb200", "v5e", "v6e"):
        assert yaml.safe_load(emit(plan, cfg, target=target))["context"] == "offload", target
