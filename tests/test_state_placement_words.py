"""A plan's ``state:`` placements (issue 60, item 12): a wrong word is answered with what training
state accepts (device, offload) — never ``remat``, which state refuses."""

from __future__ import annotations

import pytest

from tierax.errors import TieraxError
from tierax.plan import Plan


def _plan(value: str) -> str:
    head = "plan: s\ngroups:\n  decoder:\n    default: remat\n"
    return head + f"state:\n  decoder: {{moments: {value}}}\n"


@pytest.mark.parametrize("value", ["host", "pinned_host", "cpu", "hbm"])
def test_unknown_state_placement_lists_only_what_state_accepts(value):
    with pytest.raises(TieraxError) as e:
        Plan.from_yaml(_plan(value))
    msg = str(e.value)
    assert f"placement {value!r} is not valid for training state" in msg
    assert msg.endswith("use one of: device, offload")
    assert "remat" not in msg
    if value != "hbm":  # a word for host memory is pointed at 'offload'
        assert "pinned host memory is 'offload'" in msg


def test_remat_for_state_says_why():
    with pytest.raises(TieraxError, match=r"'remat' is not valid for training state \(it is not "
                       r"recomputed\); use one of: device, offload$"):  # fmt: skip
        Plan.from_yaml(_plan("remat"))


def test_cli_refuses_it_before_any_work(cli, tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(_plan("host"))
    r = cli("simulate", "--plan", p)
    assert r.returncode == 2 and "use one of: device, offload" in r.stderr
    assert "remat" not in r.stderr.split("error:")[-1]
