"""Issue 60's low items, each a fault a new user hit: refused with the problem and the fix, or
shown as what it is."""

from __future__ import annotations

import json
import os

import pytest


def test_fp8_rate_without_fp8_gemms_is_refused(cli, tmp_path):
    out = tmp_path / "p.yaml"
    r = cli("plan", "--rate", "fp8_matmul=100", "--out", out)
    assert r.returncode == 2
    assert "--rate fp8_matmul=100: tiny-llama runs no fp8 GEMMs" in r.stderr
    assert "--set quantization=fp8" in r.stderr and not out.exists()
    # with fp8 GEMMs the rate is taken, and it changes the step
    base = json.loads(cli("simulate", "--set", "quantization=fp8", "--json").stdout)
    slow = cli("simulate", "--set", "quantization=fp8", "--rate", "fp8_matmul=1", "--json")
    assert slow.returncode == 0, slow.stderr
    assert json.loads(slow.stdout)["step_time_s"] > base["step_time_s"]


def test_train_config_that_is_not_a_regular_file(cli):
    r = cli("train", "/dev/null")
    assert r.returncode == 2
    assert "'/dev/null' is not a regular file" in r.stderr and "does not exist" not in r.stderr


def _metrics(tmp_path, with_val: bool, bad_line: bool):
    run = tmp_path / ("val" if with_val else "noval")
    run.mkdir()
    lines = []
    for step in range(1, 21):
        rec = {"step": step, "loss": 5.0 - step * 0.1, "tokens_per_s": 1000.0,
               "tflops_per_device": 1.0}  # fmt: skip
        if with_val and step % 5 == 0:
            rec["val_loss"] = 5.2 - step * 0.1
        lines.append(json.dumps(rec))
        if bad_line and step == 3:
            lines.append('{"step": 3.5, "loss": ')  # an edited or cut line
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def _red_pixels(png) -> int:
    import matplotlib.colors as mcolors
    import matplotlib.image as mimg
    import numpy as np

    img = mimg.imread(png)[..., :3]
    red = np.array(mcolors.to_rgb("tab:red"))
    return int((np.abs(img - red).max(axis=-1) < 0.05).sum())


def test_plot_metrics_draws_validation_loss_and_notes_a_malformed_line(tmp_path):
    from tierax.report.metrics_plot import plot_metrics

    notes: list[str] = []
    with_val = plot_metrics(_metrics(tmp_path, True, True), note=notes.append)
    assert any("line 4 is not a JSON record" in n and "skipped" in n for n in notes), notes
    without = plot_metrics(_metrics(tmp_path, False, False), note=notes.append)
    assert _red_pixels(with_val) > 50 and _red_pixels(without) == 0


def test_plot_metrics_cli_prints_the_note(cli, tmp_path):
    run = _metrics(tmp_path, True, True)
    r = cli("plot-metrics", run)
    assert r.returncode == 0, r.stderr
    assert "note:" in r.stderr and "line 4 is not a JSON record" in r.stderr


def test_api_scripts_start_without_the_cuda_plugins_traceback(tmp_path):
    """No GPU driver here (and no TPU): importing the API chooses JAX's CPU platform before JAX
    starts, so an installed CUDA plugin does not print its start-up traceback."""
    import os
    import subprocess
    import sys

    from tierax.launch import flags

    if flags._has_nvidia_driver() or flags._has_tpu():
        import pytest

        pytest.skip("an accelerator here: JAX picks it")
    script = tmp_path / "s.py"
    script.write_text(
        "import tierax, jax, jax.numpy as jnp\n"
        "from jax.ad_checkpoint import checkpoint_name\n"
        "def loss(params, x):\n"
        "    def body(c, p):\n"
        "        f = lambda c, p: c + checkpoint_name(jnp.tanh(c @ p), 'mlpwo')\n"
        "        return jax.checkpoint(f)(c, p), None\n"
        "    return jnp.mean(jax.lax.scan(body, x, params)[0] ** 2)\n"
        "s = jax.ShapeDtypeStruct\n"
        "inv = tierax.inventory(loss, s((2, 16, 16), jnp.float32), s((4, 8, 16), jnp.float32))\n"
        "print(jax.config.jax_platforms, jax.devices()[0].platform)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cpu", "cpu"]
    assert "Traceback" not in r.stderr and "plugin" not in r.stderr.lower()


def test_moe_impl_ragged_for_mixtral_and_refused_for_a_dense_llama(cli, tmp_path):
    r = cli("simulate", "--model", "tiny-mixtral", "--set", "moe_impl=ragged", "--target", "v5p")
    assert r.returncode == 0, r.stderr
    # the same from a config file
    cfg = tmp_path / "m.yaml"
    shown = cli("models", "show", "tiny-mixtral").stdout
    assert "moe_impl: capacity" in shown
    cfg.write_text(shown.replace("moe_impl: capacity", "moe_impl: ragged"))
    assert cli("simulate", "--model-config", cfg, "--target", "v5p").returncode == 0
    # a dense model has no experts to run either way
    r = cli("simulate", "--model", "tiny-llama", "--set", "moe_impl=ragged", "--target", "v5p")
    assert r.returncode == 2 and "num_experts=0" in r.stderr and "leave moe_impl out" in r.stderr
    # another family's key is named as such
    r = cli("simulate", "--model", "tiny-deepseek", "--set", "tie_embeddings=true")
    if r.returncode == 2 and "unknown key" in r.stderr:
        assert "a key of the llama family" in r.stderr


def test_plans_show_takes_the_plans_model(cli, tmp_path):
    f = tmp_path / "dsk.yaml"
    assert cli("plan", "--model", "tiny-deepseek", "--out", f).returncode == 0
    r = cli("plans", "--show", f)  # no --model: the plan's (tiny-llama's groups would not load)
    assert r.returncode == 0, r.stderr
    assert "on tiny-deepseek" in r.stdout and "moe" in r.stdout
    r = cli("plans", "--show", f, "--model", "tiny-llama")
    assert r.returncode == 2 and "differs from the model plan" in r.stderr
    old = tmp_path / "old.yaml"
    old.write_text("plan: old\ngroups:\n  decoder:\n    default: remat\n")
    r = cli("plans", "--show", old)
    assert r.returncode == 0 and "assumed --model tiny-llama" in r.stderr


def test_every_sweep_jump_names_its_plan_change(cli):
    """tiny-llama's budget sweep: where the predicted step moves, the plan changed, and the "plan
    change" cell says what — the unnamed intermediates and the training state included."""
    from gpu_budget import fixed_bytes

    # 5.73 to 26.72 MiB for the model's own buffers beside XLA:GPU's fixed bytes (by jaxlib
    # release; 0.0095 to 0.03 GiB in all when those were 4 MiB), in steps of 0.0015 GiB
    lo, hi = ((fixed_bytes("h200") + own * 2**20) / 2**30 for own in (5.728, 26.72))
    sweep = f"budget={lo:.6f}:{hi:.6f}:0.0015"
    r = cli("plan", "--sweep", sweep, "--json")
    assert r.returncode == 0, r.stderr
    points = [p for p in json.loads(r.stdout)["points"] if p["fits"]]
    for before, after in zip(points, points[1:], strict=False):
        if after["step_time_s"] != before["step_time_s"]:
            assert after["changed"], after["value"]
    assert any("unnamed → device" in c for p in points for c in p["changed"])
    table = cli("plan", "--sweep", sweep).stdout
    assert "unnamed → device" in table and "0.000 " not in table


def test_train_config_mesh_error_names_the_configs_keys():
    import pytest

    from tierax.errors import TieraxError
    from tierax.train.config import config_from_mapping

    base = {"model": "tiny-llama", "plan": "save-all", "steps": 20}
    with pytest.raises(TieraxError) as e:
        config_from_mapping({**base, "mesh": {"fsdp": 3}}, source="c")
    assert "e.g. mesh.data=3 mesh.fsdp=1" in str(e.value) and "--mesh" not in str(e.value)
    # what it suggests is accepted (d_model 64 is not divisible by 3: the devices go to data)
    cfg = config_from_mapping({**base, "mesh": {"data": 3, "fsdp": 1}}, source="c")
    assert cfg.mesh.data == 3


def test_raw_token_ids_beside_a_tokenized_directory_are_noted(cli, tmp_path):
    import numpy as np

    from tierax.train.data.formats import open_corpus
    from tierax.train.data.streams import tokenizer_notes

    doc = tmp_path / "a.txt"
    doc.write_text("one document of some text\n" * 200)
    prepared_dir = tmp_path / "tok"
    assert cli("data", "prepare", doc, "--out", prepared_dir).returncode == 0
    raw = tmp_path / "raw.npy"
    np.save(raw, np.arange(4096, dtype=np.uint16) % 250)
    tok, ids = open_corpus(str(prepared_dir)), open_corpus(str(raw))
    notes = tokenizer_notes([tok, ids])
    assert len(notes) == 1 and "records no tokenizer" in notes[0]
    assert "raw.npy" in notes[0] and "bytes tokenizer" in notes[0]
    assert tokenizer_notes([tok]) == [] and tokenizer_notes([ids]) == []


@pytest.mark.slow  # a bench run with verify (about 30 s here)
def test_bench_verify_says_what_its_check_found(cli):
    r = cli("bench", "--model", "tiny-llama", "--plans", "minimal", "--steps", "1",
            "--microbatch", "2", "--seq", "16", "--verify")  # fmt: skip
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("gradient check before bench"))
    assert "1 plan(s) equal save-all's gradients" in line and "plan minimal" in line


def test_a_plan_file_named_after_a_preset_does_not_read_as_the_preset(cli, tmp_path):
    from tierax.cli.common import load_plans
    from tierax.models import get_config

    f = tmp_path / "m.yaml"
    f.write_text(cli("plans", "--show", "minimal", "--yaml").stdout)
    cfg = get_config("tiny-llama")
    preset, from_file = load_plans(f"minimal,{f}", cfg, "--plans")
    assert preset.name == "minimal"
    assert from_file.name == f"minimal (file {f})"
    assert from_file.groups == preset.groups  # the same placements, told apart by name


def test_cudnn_off_a_gpu_is_refused_in_one_step(cli, console_script, tmp_path):
    # the first refusal (float32) already says cuDNN runs on CUDA GPUs only, so fixing the dtype is
    # not offered as the way out on a TPU target
    r = cli("simulate", "--set", "attention=cudnn", "--target", "v5p")
    assert r.returncode == 2
    assert "on CUDA GPUs only" in r.stderr and "splash on a TPU" in r.stderr
    # a train config is told its own key, not --set (a new process: train sets XLA's options
    # before JAX starts)
    cfg = tmp_path / "t.yaml"
    cfg.write_text("model: tiny-llama\nplan: save-all\nsteps: 20\n")
    r = console_script("train", cfg, "model.attention=cudnn", "model.dtype=bfloat16",
                       env={**os.environ, "JAX_PLATFORMS": "cpu"}, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2
    assert "e.g. model.attention=blockwise" in r.stderr and "--set" not in r.stderr
