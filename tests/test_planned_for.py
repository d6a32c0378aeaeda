"""What a plan file says it was planned for — mesh, microbatch, accumulation — is what later verbs
use, whether tierax wrote the file (``plan --mesh auto``) or it is MaxText overrides; a flag that
disagrees is refused.  Each expectation is stated by hand (the sizes written), never read back
from the code under test."""

import json

import pytest
import yaml

from tierax.errors import TieraxError

SIM = ["simulate", "--model", "tiny-llama", "--json"]


def _sim(cli, *args):
    r = cli(*SIM, *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_maxtext_overrides_keep_their_mesh_and_batch_when_read_back(cli, tmp_path):
    # minimal: a plan MaxText expresses whole (save-all's kept unnamed intermediates it cannot)
    f = tmp_path / "mt.yml"
    r = cli(
        "plans", "--model", "tiny-llama", "--show", "minimal", "--emit", "maxtext",
        "--mesh", "data=2,fsdp=4", "--microbatch", "4",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    f.write_text(r.stdout)
    read_back = _sim(cli, "--plan", str(f))
    given = _sim(cli, "--plan", "minimal", "--mesh", "data=2,fsdp=4", "--microbatch", "4")
    one_device = _sim(cli, "--plan", "minimal", "--microbatch", "4")
    assert read_back == given and read_back != one_device
    # A flag that disagrees with the file is refused, naming both.
    r = cli(*SIM, "--plan", str(f), "--mesh", "fsdp=8")
    assert r.returncode == 2 and "differs from the mesh plan" in r.stderr
    assert "(data=2,fsdp=4,tensor=1,expert=1)" in r.stderr
    r = cli(*SIM, "--plan", str(f), "--microbatch", "8")
    assert r.returncode == 2 and "--microbatch 8 differs" in r.stderr and "(4 sequences" in r.stderr


def test_maxtext_tensor_axis_counts_in_the_microbatch(cli, tmp_path):
    # MaxText's per_device_batch_size counts every device; tierax's microbatch the devices of the
    # batch axes, which a tensor group shares: 2 per device × tensor 2 = 4 sequences.
    f = tmp_path / "mt.yml"
    r = cli(
        "plans", "--model", "tiny-llama", "--show", "minimal", "--emit", "maxtext",
        "--mesh", "fsdp=2,tensor=2", "--microbatch", "4",
    )  # fmt: skip
    assert r.returncode == 0 and "per_device_batch_size: 2\n" in r.stdout
    f.write_text(r.stdout)
    assert _sim(cli, "--plan", str(f)) == _sim(
        cli, "--plan", "minimal", "--mesh", "fsdp=2,tensor=2", "--microbatch", "4"
    )


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("ici_pipeline_parallelism", 2, "tierax models only the data, fsdp, tensor, expert axes"),
        ("ici_fsdp_parallelism", -1, "tierax reads explicit sizes"),
        ("per_device_batch_size", 0.5, "no whole number"),
    ],
)
def test_maxtext_mesh_tierax_cannot_model_is_refused(cli, tmp_path, key, value, fragment):
    r = cli(
        "plans", "--model", "tiny-llama", "--show", "save-all", "--emit", "maxtext",
        "--mesh", "fsdp=8",
    )  # fmt: skip
    data = yaml.safe_load(r.stdout) | {key: value}
    f = tmp_path / "mt.yml"
    f.write_text(yaml.safe_dump(data))
    r = cli(*SIM, "--plan", str(f))
    assert r.returncode == 2 and fragment in r.stderr and "Traceback" not in r.stderr


def test_a_train_config_runs_maxtext_overrides_on_their_mesh(tmp_path, cli):
    from tierax.mesh import MeshShape
    from tierax.train.config import config_from_mapping

    f = tmp_path / "mt.yml"
    r = cli(
        "plans", "--model", "tiny-llama", "--show", "save-all", "--emit", "maxtext",
        "--mesh", "data=2,fsdp=2", "--microbatch", "3",
    )  # fmt: skip
    f.write_text(r.stdout)
    cfg = config_from_mapping({"model": "tiny-llama", "plan": str(f)}, source="c")
    assert cfg.mesh == MeshShape(data=2, fsdp=2) and cfg.microbatch == 3


def _auto_plan(cli, tmp_path, *extra):
    out = tmp_path / "auto.yaml"
    r = cli(
        "plan", "--model", "tiny-llama", "--devices", "8", "--mesh", "auto", "--json",
        "--out", str(out), *extra,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), yaml.safe_load(out.read_text())["planned_for"], out


def test_mesh_search_plan_carries_microbatch_and_simulate_uses_it(cli, tmp_path):
    doc, plan, out = _auto_plan(cli, tmp_path, "--global-batch", "16")
    winner = doc["winner"]
    ways = winner["data"] * winner["fsdp"] * winner["expert"]
    best = doc["candidates"][0]
    # 16 sequences over the batch axes, in grad_accum microsteps
    assert plan["microbatch"] * plan["grad_accum"] * ways == 16
    assert (plan["microbatch"], plan["grad_accum"]) == (best["microbatch"], best["grad_accum"])
    assert plan["microbatch"] != 8  # the default a plan without it would silently get
    mesh = ",".join(f"{a}={v}" for a, v in winner.items())
    assert _sim(cli, "--plan", str(out)) == _sim(
        cli, "--plan", str(out), "--mesh", mesh, "--microbatch", str(plan["microbatch"])
    )
    r = cli(*SIM, "--plan", str(out), "--microbatch", "8")
    assert r.returncode == 2 and "--microbatch 8 differs from the microbatch" in r.stderr


def test_accumulation_a_plan_carries_reaches_train_and_the_maxtext_file(cli, tmp_path):
    from tierax.train.config import config_from_mapping

    plan = {
        "plan": "p",
        "mesh": {"fsdp": 2},
        "microbatch": 2,
        "grad_accum": 3,
        "groups": {"decoder": {"decoder_layer_input": "device"}},
    }
    cfg = config_from_mapping({"model": "tiny-llama", "plan": plan}, source="c")
    assert (cfg.microbatch, cfg.grad_accum) == (2, 3)
    differs = r"{0} {1} differs from the {0} plan 'p' was planned for \({2}\)"
    with pytest.raises(TieraxError, match=differs.format("grad_accum", 1, 3)):
        config_from_mapping({"model": "tiny-llama", "plan": plan, "grad_accum": 1}, source="c")
    with pytest.raises(TieraxError, match=differs.format("microbatch", 4, 2)):
        config_from_mapping({"model": "tiny-llama", "plan": plan, "global_batch": 8}, source="c")
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(plan))
    r = cli("plans", "--model", "tiny-llama", "--show", str(f), "--emit", "maxtext")
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load(r.stdout)
    assert data["per_device_batch_size"] == 2 and data["gradient_accumulation_steps"] == 3
    assert data["ici_fsdp_parallelism"] == 2
    # simulate takes the plan's accumulation: the step of 3 microbatches per update
    r = cli(*SIM, "--plan", str(f))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["breakdown"]["grad_accum"] == 3


def test_verify_reads_the_plans_microbatch_as_its_whole_batch(cli, tmp_path):
    # verify's --microbatch is the whole batch: 2 per device × data 2 = 4 sequences, so a given
    # 4 agrees with the plan and 2 (the per-device figure) is refused.
    f = tmp_path / "p.yaml"
    f.write_text(
        yaml.safe_dump(
            {"plan": "p", "mesh": {"data": 2}, "microbatch": 2, "groups": {"decoder": {}}}
        )
    )
    r = cli("verify", "--model", "tiny-llama", "--plan", str(f), "--microbatch", "2")
    assert r.returncode == 2 and "(4 sequences in the batch)" in r.stderr, r.stderr
