"""``--plan`` beside ``--maxtext`` (simulate; compile: tests/test_maxtext_compile.py): the plan set
as MaxText's ``remat_policy: custom`` and its per-name keys, priced as MaxText's own policy of those
keys — checked against the same keys written by hand after the config."""

from __future__ import annotations

import contextlib
import io
import json

import maxtext_cli as M
import pytest

from tierax.cli import main

pytestmark = [M.requires_maxtext, M.programs_once]

TINY = M.TINY  # d 256, 4 query / 2 kv heads of 64, MLP 512, 2 layers, vocab 1024
ON = ["--target", "h200", "--devices", "2"]
QKV_BY_HAND = [
    "remat_policy=custom",
    "query_proj=offload",
    "key_proj=offload",
    "value_proj=offload",
]


def _simulate(capsys, *argv: str) -> tuple[int, dict | None, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["simulate", "--maxtext", M.base_yml(), *TINY, *argv, *ON, "--json"])
    err = capsys.readouterr().err
    text = out.getvalue()
    return rc, (json.loads(text[text.index("{") :]) if rc == 0 else None), err


def _priced(doc: dict) -> tuple:
    return (doc["peak_device_bytes"], doc["host_bytes"], doc["step_time_s"], doc["maxtext"]["plan"])


def test_a_preset_prices_as_its_maxtext_keys_written_by_hand(capsys):
    rc, planned, _ = _simulate(capsys, "--plan", "qkv-offload")
    assert rc == 0
    rc, by_hand, _ = _simulate(capsys, *QKV_BY_HAND)
    assert rc == 0
    rc, config, _ = _simulate(capsys)  # the config's own policy (base.yml: full)
    assert rc == 0
    assert _priced(planned) == _priced(by_hand)
    assert planned["maxtext"]["remat_policy"] == "custom"
    assert planned["maxtext"]["given_plan"] == "qkv-offload"
    layers = planned["maxtext"]["plan"]["groups"]["layers"]
    assert {n for n, p in layers.items() if p == "offload"} == {
        "query_proj",
        "key_proj",
        "value_proj",
    }
    assert planned["host_bytes"] > 0 == config["host_bytes"]


def test_a_plan_file_and_an_emitted_file_give_their_placements(capsys, tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text(
        "plan: mine\ngroups:\n  layers:\n    default: remat\n    decoder_layer_input: device\n"
        "    mlpwi_0: offload\n"
    )
    rc, from_file, _ = _simulate(capsys, "--plan", str(plan))
    assert rc == 0
    rc, by_hand, _ = _simulate(capsys, "remat_policy=custom", "mlpwi_0=offload")
    assert rc == 0
    assert _priced(from_file) == _priced(by_hand) and from_file["host_bytes"] > 0
    # MaxText overrides as plan --maxtext --emit maxtext writes them, planned for a batch of 2:
    # the placements apply, the batch key is named as not applied
    emitted = tmp_path / "mt.yml"
    emitted.write_text(
        "remat_policy: custom\nquery_proj: offload\nkey_proj: offload\nvalue_proj: offload\n"
        "per_device_batch_size: 2\n"
    )
    rc, from_emitted, err = _simulate(capsys, "--plan", str(emitted))
    assert rc == 0
    rc, qkv, _ = _simulate(capsys, *QKV_BY_HAND)
    assert _priced(from_emitted) == _priced(qkv)
    assert "per_device_batch_size=2" in err and "not" in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["remat_policy=full", "--plan", "qkv-offload"],
         "remat_policy=custom (a placement per name), but remat_policy=full is given too"),
        (["query_proj=device", "--plan", "qkv-offload"],
         "--plan qkv-offload sets MaxText's query_proj=offload, but query_proj=device"),
        (["--plan", "full"], "remat_policy=full"),
        (["--plan", "{tmp}/no-such.yaml"], "neither a preset"),
    ],
)  # fmt: skip
def test_conflicts_and_bad_plans_exit_2(capsys, tmp_path, argv, needle):
    rc, _, err = _simulate(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert rc == 2 and needle in err, err[-2000:]


def test_a_plan_for_another_program_is_refused(capsys, tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: mine\ngroups:\n  decoder:\n    mlpwi_0: offload\n")
    rc, _, err = _simulate(capsys, "--plan", str(plan))
    assert rc == 2 and "'decoder'" in err and "layers" in err, err[-2000:]
