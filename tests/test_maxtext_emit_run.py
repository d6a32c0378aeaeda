"""``tierax plan --maxtext MODEL_FILE --emit maxtext`` as a MaxText user runs what it writes: the
file's "Run:" command, evaluated by a shell as printed, loads in MaxText's own config loader with
every emitted key; what ``plan`` prints is what those keys run (a plan whose unnamed intermediates
MaxText's custom policy recomputes is shown as MaxText runs it, with the warning on the terminal);
and an overrides file planned for one model is refused for another.

One plan of a MaxText model file (llama2-7b's, cut to the tiny llama2 block) serves them all."""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import shlex
import subprocess
import sys

import maxtext_cli as M
import pytest

from tierax.interop.maxtext_program import emit

pytestmark = [M.requires_maxtext, M.programs_once]

SHAPE = ["--microbatch", "2", "--seq", "256", "--devices", "4", "--target", "v5p"]


def _model_file() -> pathlib.Path:
    import maxtext

    return pathlib.Path(maxtext.__file__).parent / "configs" / "models" / "llama2-7b.yml"


USER = ["override_model_config=true", *M.TINY]


def _main(*args) -> tuple[int, str, str]:
    """``tierax ARGS`` in this process: exit code, stdout, stderr."""
    from tierax.cli import main

    out, err = io.StringIO(), io.StringIO()
    with (
        pytest.MonkeyPatch.context() as mp,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        mp.setenv("JAX_PLATFORMS", "cpu")
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """The emitted file, ``plan``'s JSON and its stderr."""
    file = tmp_path_factory.mktemp("emit") / "plan.yml"
    # --no-check: these tests read what plan emits, not MaxText's confirming compile (on by default
    # on a TPU slice; tests/test_maxtext_default_check.py covers it), which would start JAX for
    # libtpu after this process's JAX has started.
    code, out, err = _main(
        "plan", "--maxtext", _model_file(), *USER, *SHAPE, "--no-check", "--emit", "maxtext",
        "--out", file, "--json",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    return file, json.loads(out), err


def _run_command(file: pathlib.Path) -> list[str]:
    """The arguments MaxText's trainer gets from the file's "Run:" command: its two header lines
    run by bash as printed, the trainer replaced by a printer of its arguments, THIS_FILE by the
    file."""
    lines = file.read_text().splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith(emit.RUN))
    command = lines[i].removeprefix("#").strip().removesuffix("\\")
    command += " " + lines[i + 1].removeprefix("#").strip()
    trainer = "python -m maxtext.trainers.pre_train.train"
    assert command.startswith(trainer + " ")
    command = "printf '%s\\n' " + command.removeprefix(trainer + " ")
    command = command.replace("$(python ", f"$({shlex.quote(sys.executable)} ")
    command = command.replace("THIS_FILE", shlex.quote(str(file)))
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_the_run_command_loads_in_maxtexts_own_loader(planned):
    import jax
    from maxtext.configs import pyconfig

    file, _, _ = planned
    argv = _run_command(file)
    configs = pathlib.Path(pyconfig.MAXTEXT_CONFIGS_DIR)
    # a model file has no base config: MaxText reads it as model_name over base.yml
    assert argv[:2] == [str(configs / "base.yml"), "model_name=llama2-7b"]
    cache = jax.config.jax_compilation_cache_dir  # MaxText's loader moves JAX's cache
    try:
        config = pyconfig.initialize(["train.py", *argv])  # what MaxText's trainer calls
    finally:
        jax.config.update("jax_compilation_cache_dir", cache)
    emitted = emit.read_overrides(file.read_text())
    assert len(emitted) > 20 and "remat_policy=custom" in emitted
    for key, value in (a.split("=", 1) for a in [*USER, *emitted]):
        got = getattr(config, key)
        got = getattr(got, "value", got)  # MaxText's enums (RematLocation, ...)
        assert str(got).lower() == value.lower(), (key, got, value)
    assert (config.model_name, config.run_name) == ("llama2-7b", "RUN")


def test_plan_shows_what_the_emitted_keys_run(planned):
    """The tiny model keeps every intermediate at v5p's budget, which MaxText's keys cannot say:
    the figures printed are the emitted file's as ``simulate --plan`` prices it, the warning is
    on the terminal, and the file's header states the same peak."""
    file, doc, err = planned
    assert "NOT EXPRESSED" in file.read_text()
    assert "NOT EXPRESSED" in err and "what MaxText runs" in err
    code, out, err2 = _main(
        "simulate", "--maxtext", _model_file(), *USER, *SHAPE, "--plan", file, "--json"
    )
    assert code == 0, err2[-3000:]
    simulated = json.loads(out)
    assert doc["predicted"]["peak_device_bytes"] == simulated["peak_device_bytes"]
    assert doc["predicted"]["step_time_s"] == simulated["step_time_s"]
    # the plan solved keeps more than MaxText runs: its figures are not the ones shown
    assert doc["solved"]["predicted"]["peak_device_bytes"] > simulated["peak_device_bytes"]
    header = f"predicted peak {simulated['peak_device_bytes'] / 2**30:.2f} GiB per device"
    assert header in file.read_text()


def test_an_overrides_file_for_another_model_is_refused(planned, tmp_path):
    file, _, _ = planned
    text = file.read_text()
    assert f"{emit.HEADER_MODEL}llama2-7b\n" in text
    other = tmp_path / "olmo.yml"
    other.write_text(text.replace(f"{emit.HEADER_MODEL}llama2-7b", f"{emit.HEADER_MODEL}olmo3-7b"))
    code, _, err = _main("simulate", "--maxtext", _model_file(), *USER, *SHAPE, "--plan", other)
    assert code == 2, err[-2000:]
    assert "planned for MaxText model olmo3-7b" in err and "this run is llama2-7b" in err
    assert "tierax plan --maxtext" in err  # the fix


def test_the_command_loads_a_config_itself_and_a_model_file_through_model_name(tmp_path):
    from tierax.interop.maxtext_program.config import command_config

    base = M.base_yml()
    assert command_config(base) == ([base], None)
    configs = pathlib.Path(base).parent
    assert command_config(str(_model_file())) == (
        [str(configs / "base.yml"), "model_name=llama2-7b"],
        None,
    )
    mine = tmp_path / "my-llama.yml"  # a model file MaxText would not find by model_name
    mine.write_text(_model_file().read_text())
    argv, note = command_config(str(mine))
    assert argv == [str(configs / "base.yml"), "model_name=my-llama"]
    assert note and str(configs / "models" / "my-llama.yml") in note and str(mine) in note


def test_the_guide_says_cutting_layers_needs_override_model_config():
    """MaxText refuses a key its model file sets unless override_model_config=true comes first;
    the MaxText guide says so where it explains --maxtext's model files."""
    from tierax.errors import TieraxError
    from tierax.interop.maxtext_program.config import load

    cut = "base_num_decoder_layers=2"
    with pytest.raises(TieraxError, match="base_num_decoder_layers"):
        with load(str(_model_file()), [cut]):
            pass
    with load(str(_model_file()), ["override_model_config=true", cut]) as loaded:
        assert loaded.config.num_decoder_layers == 2
    guide = (pathlib.Path(__file__).parents[1] / "docs" / "guide" / "maxtext.md").read_text()
    text = " ".join(guide.split())
    assert f"override_model_config=true {cut}" in text
    assert "Cutting a model to fewer layers" in text
