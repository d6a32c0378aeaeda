"""bench/: every script starts like a script and answers --help, a bad --out is refused before any
work, and bench/_common writes records atomically and measures each child process on its own."""

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(  # the benchmarks and the finished investigations; _NAME.py are shared modules
    p for p in [*BENCH.glob("*.py"), *BENCH.glob("investigations/*.py")] if p.name[0] != "_"
)


@pytest.fixture(scope="module")
def common():
    spec = importlib.util.spec_from_file_location("_common", BENCH / "_common.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["_common"] = module  # as the scripts import it (its dataclass looks it up there)
    spec.loader.exec_module(module)
    return module


def _script(path, *args, cwd):
    return subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_help_and_bad_out(script, tmp_path):
    assert script.read_text().startswith("#!/usr/bin/env python3\n")
    r = _script(script, "--help", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("usage: "), r.stderr[-2000:]
    assert len(r.stdout) > 100, "--help says almost nothing"
    if "--out" not in r.stdout:
        assert script.name == "reference_step.py"  # prints step times; writes no record
        return
    missing = tmp_path / "missing" / "r.json"
    r = _script(script, "--out", str(missing), cwd=tmp_path)
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr[-2000:]
    assert not missing.parent.exists() and list(tmp_path.iterdir()) == []


def test_out_path_wants_json_in_an_existing_directory(common, tmp_path):
    assert common.out_path(str(tmp_path / "r.json")) == tmp_path / "r.json"
    with pytest.raises(argparse.ArgumentTypeError, match="not a .json file"):
        common.out_path(str(tmp_path / "r.txt"))
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        common.out_path(str(tmp_path / "no" / "r.json"))
    (tmp_path / "d.json").mkdir()
    with pytest.raises(argparse.ArgumentTypeError, match="is a directory"):
        common.out_path(str(tmp_path / "d.json"))


def test_write_record_renames_a_finished_file_over_the_old(common, tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    out.write_text('{"old": 1}\n')
    seen, rename = [], os.replace

    def spy(src, dst):  # the moment of the rename: the old record whole, the new one complete
        seen.append((pathlib.Path(src).parent, pathlib.Path(dst), out.read_text()))
        seen.append(json.loads(pathlib.Path(src).read_text()))
        rename(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    common.write_record(out, {"new": [1, 2]})
    assert seen == [(tmp_path, out, '{"old": 1}\n'), {"new": [1, 2]}]
    assert json.loads(out.read_text()) == {"new": [1, 2]} and list(tmp_path.iterdir()) == [out]


def test_write_record_that_fails_keeps_the_old_record(common, tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    out.write_text('{"old": 1}\n')

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        common.write_record(out, {"new": 1})
    assert out.read_text() == '{"old": 1}\n' and list(tmp_path.iterdir()) == [out]


def test_envelope_names_the_command_and_machine_without_jax(common, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(BENCH / "seed_case.py"), "--out", "x y.json"])
    doc = common.envelope("tierax.test/1")
    assert doc["schema"] == "tierax.test/1"
    assert doc["command"] == "python bench/seed_case.py --out 'x y.json'"
    assert doc["machine"]["cores"] == os.cpu_count() and "platform" not in doc["machine"]
    assert doc["jax_version"] == __import__("jax").__version__ and doc["created"].endswith("Z")
    # A script that only runs children records its machine without importing JAX.
    code = (
        f"import sys; sys.path.insert(0, {str(BENCH)!r}); import _common; "
        "v = _common.envelope('tierax.test/1')['jax_version']; print(v, 'jax' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == [__import__("jax").__version__, "False"], r.stderr[-2000:]


def test_run_measures_each_child_on_its_own(common):
    big = common.run(
        [
            sys.executable,
            "-c",
            "import sys; b = b'x' * (96 << 20); sys.stdout.write('o' * 300_000); "
            "sys.stderr.write('e'); sys.exit(3)",
        ],
        timeout=60,
    )
    assert big.returncode == 3 and big.stdout == "o" * 300_000 and big.stderr == "e"
    assert big.peak_rss_bytes >= 96 << 20 and big.wall_s > 0 and big.cpu_s >= 0
    small = common.run([sys.executable, "-c", "print('hi')"], timeout=60)
    assert small.stdout == "hi\n" and small.peak_rss_bytes < big.peak_rss_bytes - (48 << 20)
    env = dict(os.environ, TIERAX_BENCH_TEST="passed")
    code = "import os, sys; print(os.environ['TIERAX_BENCH_TEST'], os.getcwd())"
    r = common.run([sys.executable, "-c", code], env=env, cwd=BENCH, timeout=60)
    assert r.stdout.split() == ["passed", str(BENCH)]
    killed = common.run([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], timeout=60)
    assert killed.returncode == -9
    assert common.run(["/nonexistent/tool"], timeout=60).returncode == 127
    with pytest.raises(subprocess.TimeoutExpired):
        common.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)


def test_every_mutation_names_code_found_exactly_once(common):
    """bench/mutations.py patches each file's ``old`` text; code that has moved on (the text gone,
    or now in two places) would make its run stop or break the wrong place."""
    spec = importlib.util.spec_from_file_location("mutations", BENCH / "mutations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root = BENCH.parent
    counts = {m["name"]: (root / m["file"]).read_text().count(m["old"]) for m in module.MUTATIONS}
    wrong = {name: n for name, n in counts.items() if n != 1}
    assert counts and not wrong, wrong


def test_stack_converts_are_whole_array_converts_only():
    """bench/time_fidelity_trace's stack converts: a fusion whose computation converts its one
    parameter into an array of rank ≥ 3 and ≥ 16 MiB; not one doing more, nor a small or rank-2
    one (sizes by hand: f32[3,16,320,768] is 47,185,920 bytes)."""
    sys.path.insert(0, str(BENCH))
    import time_fidelity_trace as trace

    hlo = """
%conv_big (p: bf16[3,16,320,768]) -> f32[3,16,320,768] {
  %p = bf16[3,16,320,768]{3,2,1,0} parameter(0)
  ROOT %c = f32[3,16,320,768]{3,2,1,0} convert(%p)
}

%conv_more (p: bf16[3,16,320,768]) -> f32[3,16,320,768] {
  %p = bf16[3,16,320,768]{3,2,1,0} parameter(0)
  %c = f32[3,16,320,768]{3,2,1,0} convert(%p)
  ROOT %n = f32[3,16,320,768]{3,2,1,0} negate(%c)
}

%conv_small (p: bf16[3,16,32]) -> f32[3,16,32] {
  %p = bf16[3,16,32]{2,1,0} parameter(0)
  ROOT %c = f32[3,16,32]{2,1,0} convert(%p)
}

%conv_flat (p: bf16[8192,4096]) -> f32[8192,4096] {
  %p = bf16[8192,4096]{1,0} parameter(0)
  ROOT %c = f32[8192,4096]{1,0} convert(%p)
}

ENTRY %main (a: bf16[3,16,320,768], b: bf16[3,16,32], d: bf16[8192,4096]) -> f32[3,16,320,768] {
  %a = bf16[3,16,320,768]{3,2,1,0} parameter(0)
  %b = bf16[3,16,32]{2,1,0} parameter(1)
  %d = bf16[8192,4096]{1,0} parameter(2)
  %wrapped_convert.1 = f32[3,16,320,768]{3,2,1,0} fusion(%a), kind=kLoop, calls=%conv_big
  %fusion.2 = f32[3,16,320,768]{3,2,1,0} fusion(%a), kind=kLoop, calls=%conv_more
  %wrapped_convert.3 = f32[3,16,32]{2,1,0} fusion(%b), kind=kLoop, calls=%conv_small
  %wrapped_convert.4 = f32[8192,4096]{1,0} fusion(%d), kind=kLoop, calls=%conv_flat
  ROOT %t = f32[3,16,320,768]{3,2,1,0} add(%wrapped_convert.1, %fusion.2)
}
"""
    assert trace.stack_converts(hlo) == {
        "wrapped_convert.1": {"shape": "f32[3,16,320,768]", "bytes": 3 * 16 * 320 * 768 * 4}
    }


def test_union_of_op_intervals_counts_overlaps_once():
    """bench/time_fidelity_trace's busy time: [0, 10] ∪ [5, 15] ∪ [20, 30] µs is 25 µs; a nested
    interval adds nothing; order does not matter."""
    sys.path.insert(0, str(BENCH))
    import time_fidelity_trace as trace

    assert trace._union_s([(20, 30), (0, 10), (5, 15)]) == pytest.approx(25e-6)
    assert trace._union_s([(0, 10), (2, 3)]) == pytest.approx(10e-6)
    assert trace._union_s([]) == 0.0


def test_a_record_written_elsewhere_leaves_the_docs_table(common, tmp_path):
    """A MaxText bench run with another --out (a trial, a subset of cases) writes its record there
    and leaves the docs page's table as it is; only the docs' own record rewrites it."""
    spec = importlib.util.spec_from_file_location("_maxtext", BENCH / "_maxtext.py")
    maxtext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maxtext)
    page = common.docs_page("maxtext-fidelity")
    before = page.read_bytes()
    out = tmp_path / "trial.json"
    rc = maxtext.run_cases(
        ["--out", str(out), "--cases", "one"],
        doc="A trial.",
        out="maxtext_fidelity.json",
        schema="tierax.bench.trial/1",
        marker="maxtext-fidelity",
        cases=[("one",), ("two",)],
        run_case=lambda name: {"name": name},
        render=lambda doc: "| a table of one row |",
    )
    assert rc == 0 and page.read_bytes() == before
    assert [c["name"] for c in json.loads(out.read_text())["cases"]] == ["one"]
    assert common.docs_follow(common.RESULTS / "maxtext_fidelity.json", "maxtext_fidelity.json")
    assert not common.docs_follow(out, "maxtext_fidelity.json")
