"""Faults a new user hit (issue 40, items 1-13), each run the way the user ran it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest


def _python(code: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"},
    )


def _tierax(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return _python("import sys; from tierax.cli import main; sys.exit(main())", *args, cwd=cwd)


# -- 1: the solver's C++ output never reaches stdout -------------------------------------------

# HiGHS' log, switched on (disp=True), is written by the C++ library straight to fd 1 -- the same
# path as the chatter the user saw -- so every solve here prints real native output.
_LOUD_HIGHS = """
    import sys
    import scipy.optimize
    real = scipy.optimize.milp
    def loud(*a, **k):
        k["options"] = {**(k.get("options") or {}), "disp": True}
        return real(*a, **k)
    scipy.optimize.milp = loud
    from tierax.cli import main
    sys.exit(main())
"""


def test_plan_json_is_one_document_while_highs_writes_to_fd1():
    budget = str(25 * 2**20 / 2**30)
    args = ["plan", "--model", "tiny-llama", "--set", "num_layers=6", "--microbatch", "8"]
    r = _python(_LOUD_HIGHS, *args, "--seq", "64", "--budget-gib", budget, "--segments", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # exactly one JSON document: nothing before or after it
    assert doc["plan"]["groups"]["decoder"]["segments"]
    assert "HiGHS" in r.stderr or "Running HiGHS" in r.stderr  # the log went to stderr instead
