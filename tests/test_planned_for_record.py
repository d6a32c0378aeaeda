"""A plan file written by ``tierax plan`` records what it was planned for (``planned_for``), and
every verb that reads it runs at those sizes without a flag repeated: the same figures as the
flags given by hand, a differing flag refused naming both values, an older file read with a note
saying what was assumed.  Expected values are the sizes the test wrote, stated by hand."""

import json
import os
import subprocess
import sys

import pytest
import yaml

SIM = ["simulate", "--json"]


def _ok(r):
    assert r.returncode == 0, r.stderr
    return r


def _plan(cli, tmp_path, name, *args):
    out = tmp_path / name
    _ok(cli("plan", "--model", "tiny-llama", "--out", str(out), *args))
    return out, yaml.safe_load(out.read_text())


def _old(tmp_path, doc, name="old.yaml"):
    """The same plan as a file written before planned_for was recorded."""
    f = tmp_path / name
    f.write_text(yaml.safe_dump({k: v for k, v in doc.items() if k != "planned_for"}))
    return f


def test_grad_accum_plan_simulates_its_accumulated_step(cli, tmp_path):
    f, doc = _plan(cli, tmp_path, "ga4.yaml", "--grad-accum", "4", "--microbatch", "2")
    assert doc["planned_for"] == {
        "model": "tiny-llama",
        "target": "h200",
        "mesh": {"data": 1, "fsdp": 1, "tensor": 1, "expert": 1},
        "microbatch": 2,
        "seq": 64,
        "grad_accum": 4,
        "schedule": "lhs",
    }
    read = json.loads(_ok(cli(*SIM, "--plan", str(f))).stdout)
    by_hand = json.loads(
        _ok(cli(*SIM, "--plan", str(_old(tmp_path, doc)), "--microbatch", "2", "--grad-accum", "4"))
        .stdout
    )
    one_step = json.loads(_ok(cli(*SIM, "--plan", str(_old(tmp_path, doc)), "--microbatch", "2"))
                          .stdout)  # fmt: skip
    assert read["breakdown"]["grad_accum"] == 4
    assert read == by_hand and read != one_step


def test_max_microbatch_plan_records_the_microbatch_it_found(cli, tmp_path):
    r = _ok(cli("plan", "--model", "tiny-llama", "--max-microbatch", "--seq", "1024",
                "--target", "h100", "--json"))  # fmt: skip
    found = json.loads(r.stdout)["microbatch"]
    sizes = ("--seq", "1024", "--target", "h100")
    f, doc = _plan(cli, tmp_path, "mb.yaml", "--max-microbatch", *sizes)
    assert doc["planned_for"]["microbatch"] == found and found not in (1, 8)
    assert doc["plan"] == f"planned-mb{found}"
    assert (doc["planned_for"]["seq"], doc["planned_for"]["target"]) == (1024, "h100")
    read = json.loads(_ok(cli(*SIM, "--plan", str(f))).stdout)
    by_hand = _ok(cli(*SIM, "--plan", str(_old(tmp_path, doc)), "--microbatch", str(found),
                      "--seq", "1024", "--target", "h100"))  # fmt: skip
    assert read == json.loads(by_hand.stdout)
    assert read["fits"] and read["device_capacity_bytes"] < 100 * 2**30  # h100's 80 GB, not h200


def test_max_microbatch_with_a_microbatch_is_refused(cli, tmp_path):
    out = tmp_path / "x.yaml"
    r = cli("plan", "--model", "tiny-llama", "--max-microbatch", "--microbatch", "4",
            "--out", str(out))  # fmt: skip
    assert r.returncode == 2 and "--microbatch would be ignored" in r.stderr
    assert not out.exists()


def test_emitted_maxtext_overrides_carry_the_planned_sizes(cli, tmp_path):
    f, _ = _plan(cli, tmp_path, "v5p.yaml", "--mesh", "fsdp=8", "--target", "v5p",
                 "--seq", "256", "--microbatch", "2", "--grad-accum", "2")  # fmt: skip
    r = _ok(cli("plans", "--model", "tiny-llama", "--show", str(f), "--emit", "maxtext"))
    mt = yaml.safe_load(r.stdout)
    assert mt["max_target_length"] == 256 and mt["hardware"] == "tpu"
    assert mt["ici_fsdp_parallelism"] == 8 and mt["per_device_batch_size"] == 2
    assert mt["gradient_accumulation_steps"] == 2
    assert mt["attention"] != "cudnn_flash_jax"  # a TPU's attention, not the GPU default's
    # --grad-accum is an option of plans --emit (a preset has no record: it is taken as given)
    r = _ok(cli("plans", "--model", "tiny-llama", "--show", "minimal", "--emit", "maxtext",
                "--grad-accum", "3"))  # fmt: skip
    assert yaml.safe_load(r.stdout)["gradient_accumulation_steps"] == 3


@pytest.mark.parametrize(
    "verb, flag, value, recorded",
    [
        ("simulate", "--grad-accum", "2", "(4)"),
        ("simulate", "--seq", "128", "(32 tokens)"),
        ("simulate", "--target", "h100", "(h200)"),
        ("simulate", "--schedule", "serial", "(lhs)"),
        ("simulate", "--model", "tiny-deepseek", "(tiny-llama)"),
        ("simulate", "--mesh", "data=1,fsdp=4,tensor=1,expert=1", "(data=1,fsdp=2,tensor=1,"),
        ("simulate", "--microbatch", "4", "(2 sequences per device)"),
        ("plans", "--grad-accum", "2", "(4)"),
        ("plans", "--target", "v5p", "(h200)"),
        ("bench", "--seq", "128", "(32 tokens)"),
    ],
)
def test_a_differing_flag_exits_2_naming_both_and_writes_nothing(
    cli, tmp_path, verb, flag, value, recorded
):
    f, _ = _plan(cli, tmp_path, "p.yaml", "--grad-accum", "4", "--microbatch", "2",
                 "--seq", "32", "--mesh", "fsdp=2")  # fmt: skip
    out = tmp_path / "bench.json"
    args = {
        "simulate": ["simulate", "--plan", str(f)],
        "plans": ["plans", "--show", str(f), "--emit", "maxtext"],
        "bench": ["bench", "--plans", str(f), "--steps", "1", "--out", str(out)],
    }[verb]
    r = cli(*args, flag, value)
    assert r.returncode == 2, r.stderr
    assert f"{flag} {value} differs" in r.stderr and recorded in r.stderr and "p.yaml" in r.stderr
    assert r.stdout == "" and not out.exists()


def test_old_plan_file_loads_with_a_note_of_what_was_assumed(cli, tmp_path):
    _, doc = _plan(cli, tmp_path, "p.yaml", "--microbatch", "2")
    old = _old(tmp_path, doc)
    r = _ok(cli(*SIM, "--plan", str(old)))
    for assumed in ("--seq 64", "--target h200", "--microbatch 8", "--model tiny-llama"):
        assert f"assumed {assumed}" in r.stderr, r.stderr
    # the defaults, exactly: the same figures as the flags given by hand
    given = ("--seq", "64", "--target", "h200", "--microbatch", "8", "--model", "tiny-llama")
    assert json.loads(r.stdout) == json.loads(_ok(cli(*SIM, "--plan", str(old), *given)).stdout)
    # a file of the first planned_for release (mesh, microbatch, grad_accum at the top) too
    legacy = tmp_path / "legacy.yaml"
    legacy.write_text(yaml.safe_dump({**yaml.safe_load(old.read_text()), "microbatch": 2}))
    r = _ok(cli(*SIM, "--plan", str(legacy)))
    assert "assumed --microbatch" not in r.stderr and "assumed --seq 64" in r.stderr


def test_bench_runs_the_planned_sizes(cli, console_script, tmp_path):
    f, _ = _plan(cli, tmp_path, "p.yaml", "--microbatch", "1", "--seq", "16", "--mesh", "fsdp=2")
    # its own process: bench starts JAX on the plan's 2 devices (this one runs 8 already)
    run = console_script("bench", "--plans", f, "--steps", "1", "--json")
    doc = json.loads(_ok(run).stdout)
    assert (doc["microbatch_per_device"], doc["seq"]) == (1, 16)
    assert doc["mesh"] == {"data": 1, "fsdp": 2, "tensor": 1, "expert": 1}


def test_a_plan_for_a_config_file_is_refused_for_another(cli, tmp_path):
    cfg = tmp_path / "m.yaml"
    cfg.write_text(_ok(cli("models", "show", "tiny-llama")).stdout)
    f = tmp_path / "p.yaml"
    _ok(cli("plan", "--model-config", str(cfg), "--out", str(f)))
    digest = yaml.safe_load(f.read_text())["planned_for"]["model"]
    assert digest.startswith("sha256:") and len(digest) == len("sha256:") + 16
    _ok(cli(*SIM, "--plan", str(f), "--model-config", str(cfg)))
    r = cli(*SIM, "--plan", str(f))  # the file is not named: the plan cannot stand in for it
    assert r.returncode == 2 and "--model-config FILE" in r.stderr and digest in r.stderr
    cfg.write_text(cfg.read_text().replace("num_layers: 4", "num_layers: 2"))
    r = cli(*SIM, "--plan", str(f), "--model-config", str(cfg))
    assert r.returncode == 2 and f"differs from the model plan {f} was planned for ({digest})" in (
        r.stderr
    )


def test_api_refuses_a_budget_above_the_device():
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    import tierax
    from tierax.errors import TieraxError

    def loss(params, x):
        def body(c, p):
            layer = jax.checkpoint(lambda c, p: c + checkpoint_name(jnp.tanh(c @ p), "mlpwo"))
            return layer(c, p), None

        return jnp.mean(jax.lax.scan(body, x, params)[0] ** 2)

    params = jax.ShapeDtypeStruct((2, 16, 16), jnp.float32)
    inv = tierax.inventory(loss, params, jax.ShapeDtypeStruct((4, 8, 16), jnp.float32))
    # h200: 141 GiB of HBM, of which a step may use 95 % (the CLI's --budget-gib says the same)
    with pytest.raises(TieraxError, match=r"budget=536870912000 is more than h200's device offers"):
        tierax.plan(inv, target="h200", budget=500 * 2**30)
    assert tierax.plan(inv, target="h200", budget=40 * 2**30).predicted.fits


def test_compile_takes_the_planned_sizes(cli, tmp_path):
    plan = tmp_path / "p.yaml"
    run = [sys.executable, "-m", "tierax.cli"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    # the plan written in this process; compile (JAX started for a deviceless GPU) in a new one
    _ok(cli("plan", "--model", "tiny-llama", "--microbatch", "1", "--seq", "16", "--target",
            "h100", "--mesh", "fsdp=2", "--grad-accum", "2", "--out", str(plan)))  # fmt: skip
    r = subprocess.run([*run, "compile", "--plan", str(plan), "--json"], capture_output=True,
                       text=True, env=env, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["target"], doc["microbatch"], doc["seq"], doc["devices"]) == ("h100", 1, 16, 2)
    r = subprocess.run([*run, "compile", "--plan", str(plan), "--grad-accum", "1"],
                       capture_output=True, text=True, env=env)  # fmt: skip
    assert r.returncode == 2 and "--grad-accum 1 differs" in r.stderr and "(2)" in r.stderr


def test_the_same_overrides_in_another_order_are_the_same_model():
    """The chip session's plans were planned with ``--set`` overrides in one order and benched with
    them in another: the same config, accepted; a differing value (or a later ``--set`` of the same
    key that wins with another value) is refused."""
    from tierax.errors import TieraxError
    from tierax.plan.planned_for import PlannedFor, merge_planned_for

    planned = PlannedFor(model="tiny-llama --set d_model=64 --set num_heads=4")
    given = {"model": "tiny-llama --set num_heads=4 --set d_model=64"}
    values, _ = merge_planned_for(planned, given, {}, plan="p.yaml")
    assert values["model"] == given["model"]
    # the last --set of a key wins: d_model=32 then 64 is d_model=64
    repeated = {"model": "tiny-llama --set d_model=32 --set num_heads=4 --set d_model=64"}
    assert merge_planned_for(planned, repeated, {}, plan="p.yaml")[0]["model"]
    for other in ("tiny-llama --set num_heads=4 --set d_model=32", "tiny-llama --set d_model=64",
                  "tiny-mixtral --set d_model=64 --set num_heads=4"):  # fmt: skip
        with pytest.raises(TieraxError, match="differs from the model plan p.yaml"):
            merge_planned_for(planned, {"model": other}, {}, plan="p.yaml")
