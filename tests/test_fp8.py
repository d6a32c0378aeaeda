"""``quantization: fp8``: delayed scaling hand-checked, the GEMM against Flax's independent
``linen.fp8_ops``, gradients of both families × every preset against the float32 step, a short
training run against float32's loss, the state through the optimizer step, accumulation and a
checkpoint."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.linen import fp8_ops

from tierax import plan as plan_lib
from tierax.errors import TieraxError
from tierax.models import apply_overrides, fp8, get_config
from tierax.tracing.model_program import for_inventory
from tierax.train import step as S

K = jax.tree_util.keystr
N = fp8.AMAX_HISTORY


def _meta(scale, history):
    h = np.zeros((N,), np.float32)
    h[: len(history)] = history
    return {"scale": jnp.float32(scale), "history": jnp.asarray(h)}


def test_scale_and_history_hand_checked_on_a_tiny_gemm():
    x = jnp.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]], jnp.float32)  # max |x| = 3
    w = jnp.array([[0.5, 1.0], [-1.5, 0.0], [2.0, 0.75]], jnp.float32)  # max |w| = 2
    g = jnp.array([[0.01, -0.04], [0.02, 0.03]], jnp.float32)  # max |g| = 0.04
    xm, wm, gm = _meta(1.0, [3.5, 7.0]), _meta(1.0, []), _meta(0.5, [0.0, 0.1])
    dims = (((1,), (0,)), ((), ()))
    _, vjp = jax.vjp(
        lambda a, b, m1, m2, m3: fp8.fp8_dot_general(a, b, m1, m2, m3, dims, "float32"),
        x,
        w,
        xm,
        wm,
        gm,
    )
    _, _, x_next, w_next, g_next = vjp(jnp.ones((2, 2), jnp.float32) * g)
    # Scale = max(history) / fp8 max: e4m3 448, e5m2 57344; an all-zero history keeps the scale.
    assert float(x_next["scale"]) == np.float32(7.0) / np.float32(448.0)
    assert float(w_next["scale"]) == 1.0
    assert float(g_next["scale"]) == np.float32(0.1) / np.float32(57344.0)
    # History: rolled left by one, this step's amax written at slot 0 (slot 1 was the oldest).
    assert x_next["history"][0] == 3.0 and x_next["history"][-1] == 3.5
    assert x_next["history"][1] == 0.0 and jnp.sum(x_next["history"]) == 6.5
    assert w_next["history"][0] == 2.0 and jnp.sum(w_next["history"]) == 2.0
    assert g_next["history"][0] == np.float32(0.04) and g_next["history"][-1] == 0.0


def test_quantize_rounds_to_e4m3_with_the_scale():
    # 448 · s is the largest finite e4m3 value; beyond is clipped, 0.3/s rounds to e4m3's grid.
    s = jnp.float32(0.5)
    q = fp8.quantize(jnp.array([1000.0, 0.3, -224.0]), fp8.FORWARD, s)
    assert q.dtype == jnp.float8_e4m3fn
    np.testing.assert_array_equal(np.asarray(q.astype(jnp.float32)), [448.0, 0.625, -448.0])


def test_gemm_equals_flax_fp8_ops():
    """Forward, both input gradients and the three next metas equal Flax's fp8_scaled_dot_general
    (an independent implementation of the same recipe) on a [16, 32] × [32, 8] GEMM."""
    # standard normal float32 drawn by NumPy (jax.random compiles a program for every shape)
    rng = np.random.default_rng(0)
    x, w, g = (
        jnp.asarray(rng.standard_normal(s, dtype=np.float32)) for s in ((16, 32), (32, 8), (16, 8))
    )
    x, w, g = x * 3, w * 0.1, g * 1e-3
    xm, wm, gm = _meta(1.0, [9.0, 11.0]), _meta(1.0, [0.4]), _meta(1.0, [2e-3, 5e-3])
    dims = (((1,), (0,)), ((), ()))

    def ours(x, w, xm, wm, gm):
        return fp8.fp8_dot_general(x, w, xm, wm, gm, dims, "float32")

    def flax(x, w, xm, wm, gm):
        return fp8_ops.fp8_scaled_dot_general(
            x,
            w,
            dims,
            preferred_element_type=jnp.float32,
            lhs_scale=xm["scale"],
            rhs_scale=wm["scale"],
            grad_scale=gm["scale"],
            lhs_amax_history=xm["history"],
            rhs_amax_history=wm["history"],
            grad_amax_history=gm["history"],
        )

    y, vjp = jax.vjp(ours, x, w, xm, wm, gm)
    y_ref, vjp_ref = jax.vjp(flax, x, w, xm, wm, gm)
    np.testing.assert_allclose(y, y_ref, rtol=1e-6, atol=1e-6)
    ours_ct, ref_ct = vjp(g), vjp_ref(g)
    # Flax scales after the dot, we before: float32 summation order only.
    for a, b in zip(jax.tree.leaves(ours_ct), jax.tree.leaves(ref_ct), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * float(jnp.max(jnp.abs(b))))
    # And it is fp8: the product differs from the float32 one by more than float32 rounding.
    assert float(jnp.max(jnp.abs(y - x @ w))) > 1e-3 * float(jnp.max(jnp.abs(x @ w)))


def _fp8(name):
    return dataclasses.replace(get_config(name), quantization="fp8")


def _rel(a, b) -> float:
    return float(jnp.linalg.norm((a - b).ravel()) / jnp.linalg.norm(b.ravel()))


def _calibrated(cfg, graphdef, params, tokens):
    """``params`` with the metas one step leaves (the scales of real amaxes, not the first
    step's 1.0)."""
    _, grads = S.loss_and_grads(graphdef, cfg, plan_lib.preset("save-all", cfg), params, tokens)
    return fp8.overwrite_meta(params, grads)


# Per-leaf relative (Frobenius) gradient error of the fp8 step against the float32 one, same
# params, tokens and scales.  e4m3 keeps 3 mantissa bits (rounding ≤ 2⁻⁴ relative), e5m2 2 bits
# (≤ 2⁻³), compounded over the 4 layers; DeepSeek's routing (top-k of fp8-perturbed inputs) and
# capacity drops move whole tokens between experts, so its tolerance is wider.  Measured worst
# leaves: 0.16 (tiny-llama), 0.43 (tiny-deepseek).
FP8_GRAD_TOL = {"tiny-llama": 0.25, "tiny-deepseek": 0.6}


@pytest.fixture(
    scope="module",
    params=[
        "tiny-llama",
        # Four gradient compiles of the MoE model: minutes on a shared CPU.
        pytest.param("tiny-deepseek", marks=pytest.mark.slow),
    ],
)
def fp8_reference(request):
    base = get_config(request.param)
    cfg = _fp8(request.param)
    tokens = S.synthetic_batch(cfg, 4, 32, seed=2)
    g0, p0 = S.init_params(base, seed=1)
    g8, p8 = S.init_params(cfg, seed=1)
    p8 = _calibrated(cfg, g8, p8, tokens)
    _, ref = S.loss_and_grads(g0, base, plan_lib.preset("save-all", base), p0, tokens)
    _, grads8 = S.loss_and_grads(g8, cfg, plan_lib.preset("save-all", cfg), p8, tokens)
    return cfg, g8, p8, tokens, ref, grads8


def test_fp8_gradients_within_tolerance_of_float32(fp8_reference):
    cfg, _, _, _, ref, grads8 = fp8_reference
    params8 = {K(k): v for k, v in jax.tree_util.tree_leaves_with_path(fp8.split_meta(grads8)[0])}
    errs = {K(k): _rel(params8[K(k)], v) for k, v in jax.tree_util.tree_leaves_with_path(ref)}
    worst = max(errs, key=errs.get)
    assert errs[worst] <= FP8_GRAD_TOL[cfg.name], f"{cfg.name}: {worst} off by {errs[worst]:.3g}"
    # fp8 really ran: every projection's gradient moved by more than float32 rounding.
    kernels = [e for k, e in errs.items() if "kernel" in k and "head" not in k]
    assert kernels and min(kernels) > 1e-3
    # The metas are the only extra state: 6 arrays per fp8 GEMM (tiny-llama: 7 GEMMs a layer;
    # tiny-deepseek: MLA's 5 in both groups, 3 dense MLP, 3 routed-expert and 3 shared-expert).
    gemms = {"tiny-llama": 7, "tiny-deepseek": 5 + 3 + 5 + 3 + 3}[cfg.name]
    assert len(params8) - len(errs) == 6 * gemms


@pytest.mark.slow  # a gradient compile per family × preset: minutes on a shared CPU
@pytest.mark.parametrize("preset", [p for p in plan_lib.PRESETS if p != "save-all"])
def test_fp8_gradients_equal_under_every_preset(fp8_reference, preset):
    """A plan changes where residuals live, not the fp8 numerics: gradients and next metas equal
    the save-all step's exactly."""
    cfg, graphdef, params, tokens, _, grads8 = fp8_reference
    _, grads = S.loss_and_grads(graphdef, cfg, plan_lib.preset(preset, cfg), params, tokens)
    worst = max(
        jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), grads, grads8))
    )
    assert worst <= 1e-6 * max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads8))


def _train(cfg, steps, *, grad_accum=1):
    opt = S.make_optimizer(3e-3)
    graphdef, state = S.init_state(cfg, opt, seed=3)
    step = S.make_train_step(
        graphdef, cfg, plan_lib.preset("minimal", cfg), opt, grad_accum=grad_accum
    )
    losses = []
    for i in range(steps):
        tokens = S.synthetic_batch(cfg, 4, 32, seed=100 + i % 4)
        if grad_accum > 1:
            tokens = tokens.reshape(grad_accum, 4 // grad_accum, -1)
        state, m = step(state, tokens)
        losses.append(float(m["loss"]))
    return state, losses


# A tiny Llama trained 16 steps on 4 repeating batches: the fp8 run's last loss within 3 % of
# float32's (measured: 1.1 %, the first step's unit scales included), and both fell.
FP8_LOSS_MARGIN = 0.03


@pytest.mark.slow  # two 16-step training runs
def test_fp8_training_ends_within_margin_of_float32():
    base = get_config("tiny-llama")
    state8, loss8 = _train(_fp8("tiny-llama"), 16)
    _, loss0 = _train(base, 16)
    assert loss8[-1] < loss8[0] - 0.1 and loss0[-1] < loss0[0] - 0.1
    assert abs(loss8[-1] - loss0[-1]) <= FP8_LOSS_MARGIN * loss0[-1], (loss8, loss0)
    # The optimizer never touched the metas: each scale is the amax of its history over fp8 max.
    layer = state8.params["groups"]["decoder"]["attention"]["wq"]
    hist, scale = layer["fp8_input_history"][...], layer["fp8_input_scale"][...]
    assert hist.shape == (4, N) and int(jnp.sum(hist[0] > 0)) == 16  # one amax per step
    # The scale used by step 16 came from steps 1..15 (delayed): history without slot 0.
    prev = jnp.max(hist[:, 1:], axis=1) / 448.0
    np.testing.assert_allclose(scale, prev, rtol=1e-6)


@pytest.mark.slow  # a grad-accumulation step compile and two gradient compiles
def test_accumulated_metas_take_the_step_amax():
    """With 2 microbatches each history's new slot is the larger microbatch amax, not a sum or an
    average."""
    cfg = _fp8("tiny-llama")
    opt = S.make_optimizer(3e-3)
    graphdef, state = S.init_state(cfg, opt, seed=3)
    step = S.make_train_step(graphdef, cfg, plan_lib.preset("minimal", cfg), opt, grad_accum=2)
    tokens = S.synthetic_batch(cfg, 4, 32, seed=5)
    plan = plan_lib.preset("minimal", cfg)
    _, g_a = S.loss_and_grads(graphdef, cfg, plan, state.params, tokens[:2])
    _, g_b = S.loss_and_grads(graphdef, cfg, plan, state.params, tokens[2:])
    new, _ = step(state, tokens.reshape(2, 2, -1))  # donates state
    got = new.params["groups"]["decoder"]["mlp"]["wo"]["fp8_grad_history"][...][:, 0]
    a = g_a["groups"]["decoder"]["mlp"]["wo"]["fp8_grad_history"][...][:, 0]
    b = g_b["groups"]["decoder"]["mlp"]["wo"]["fp8_grad_history"][...][:, 0]
    np.testing.assert_array_equal(got, jnp.maximum(a, b))
    assert bool(jnp.any(a != b))


@pytest.mark.slow  # a 3-step training run and an Orbax round trip
def test_checkpoint_restores_the_scales_exactly(tmp_path):
    from tierax.train import checkpoint as C

    cfg = _fp8("tiny-llama")
    state, _ = _train(cfg, 3)
    ckpt = C.Checkpointer(tmp_path / "ck", keep=1, asynchronous=False)
    ckpt.save(3, state, {"note": "fp8"})
    ckpt.wait()
    opt = S.make_optimizer(3e-3)
    _, fresh = S.init_state(cfg, opt, seed=9)
    restored, _ = ckpt.restore(3, fresh)
    ckpt.close()
    metas = [
        (K(k), v) for k, v in jax.tree_util.tree_leaves_with_path(state.params) if "fp8_" in K(k)
    ]
    got = {K(k): v for k, v in jax.tree_util.tree_leaves_with_path(restored.params)}
    assert len(metas) == 7 * 6  # 7 GEMMs a layer, 3 tensors each, a scale and a history
    for k, v in metas:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(v))
        assert got[k].dtype == v.dtype
    assert any(float(jnp.max(v)) not in (0.0, 1.0) for _, v in metas)  # real, not initial values


def test_quantization_key_validated():
    cfg = apply_overrides(get_config("tiny-llama"), ["quantization=fp8"])
    assert cfg.quantization == "fp8"
    with pytest.raises(TieraxError, match=r"quantization='int8' is not supported.*'fp8'"):
        apply_overrides(get_config("tiny-llama"), ["quantization=int8"])


def test_maxtext_overrides_carry_quantization_and_read_back(tmp_path):
    import yaml

    from tierax.interop import files, maxtext, maxtext_keys

    cfg = _fp8("tiny-llama")
    plan = plan_lib.preset("qkv-offload", cfg)
    text = maxtext.overrides_yaml(
        plan, cfg, microbatch=2, seq=64, mesh={"data": 1, "fsdp": 2, "tensor": 1, "expert": 1}
    )
    assert yaml.safe_load(text)["quantization"] == "fp8"
    f = tmp_path / "mt.yml"
    f.write_text(text)
    # the placements, and the mesh and microbatch the file was written for
    back = files.load_plan(str(f), cfg)
    assert back == dataclasses.replace(plan, planned_for=back.planned_for)
    assert back.microbatch == 2
    assert dict(back.mesh) == {"data": 1, "fsdp": 2, "tensor": 1, "expert": 1}
    # The same file is not the bf16 model's: its quantization differs.
    with pytest.raises(TieraxError, match=r"quantization 'fp8' \(here ''\)"):
        files.load_plan(str(f), get_config("tiny-llama"))
    # A MaxText model YAML with the key is read as the fp8 config; a value not run here is refused.
    model = {k: v for k, v in yaml.safe_load(text).items() if k in maxtext_keys.model_keys(cfg)}
    (tmp_path / "m.yml").write_text(yaml.safe_dump(model))
    assert files.load_model_config(tmp_path / "m.yml").quantization == "fp8"
    (tmp_path / "int8.yml").write_text(yaml.safe_dump({**model, "quantization": "int8"}))
    with pytest.raises(TieraxError, match="quantization='int8' is not supported"):
        files.load_model_config(tmp_path / "int8.yml")


def test_inventory_share_of_fp8_flops_hand_computed():
    """tiny-llama, 2 × 32 tokens: the 7 projections' 2·T·(d·h·hd + 2·d·k·hd + h·hd·d + 3·d·f)
    FLOPs over the layer's matmul FLOPs (attention's two score GEMMs stay in the compute dtype)."""
    from tierax.tracing import inventory as inv

    mesh = {"data": 1, "fsdp": 1, "tensor": 1, "expert": 1}
    g8 = inv.model_inventory(_fp8("tiny-llama"), 2, 32, mesh).groups[0]
    g0 = inv.model_inventory(get_config("tiny-llama"), 2, 32, mesh).groups[0]
    T, d, h, k, hd, f = 64, 64, 4, 2, 16, 128
    proj = 2 * T * (d * h * hd + 2 * d * k * hd + h * hd * d + 3 * d * f)
    assert g8.forward_flops_per_layer == g0.forward_flops_per_layer
    assert g8.fp8_flops_share == pytest.approx(proj / g8.forward_flops_per_layer, rel=1e-12)
    assert g0.fp8_flops_share == 0.0
    # The metas are counted as parameters: 7 GEMMs × 3 tensors × (scale + history).
    assert g8.layer_param_count - g0.layer_param_count == 7 * 3 * (1 + N)


def test_fp8_gemms_priced_at_the_published_fp8_sweep():
    from tierax.costmodel import rates as R

    # the published fp8 sweeps' best shapes at sustained power (tests/test_kernel_rates.py):
    # H200 1453.4 TFLOP/s × 257/271.2 × 0.94, GB200 3615.6 × 1550/1822
    r = R.target_rates("h200", "bfloat16", calibration={})
    assert r.fp8_matmul_flops_per_s == pytest.approx(1453.4e12 * 257 / 271.2 * 0.94)
    assert "1453.4 TFLOP/s fp8" in r.sources["fp8_matmul"]
    assert R.target_rates("gb200", "bfloat16", calibration={}).fp8_matmul_flops_per_s == (
        pytest.approx(3615.6e12 * 1550 / 1822)
    )
    F, s = 1e15, 0.9
    want = s * F / r.fp8_matmul_flops_per_s + (1 - s) * F / r.matmul_flops_per_s
    assert R.matmul_s(F, 0.0, r, fp8_share=s) == pytest.approx(want, rel=1e-12)
    assert R.matmul_s(F, 0.0, r, backward=True, fp8_share=s) == pytest.approx(2 * want)
    # Fused attention FLOPs are never fp8: the share is capped by the unfused FLOPs.
    fused = 0.2 * F
    got = R.matmul_s(F, fused, r, fp8_share=s)
    assert got == pytest.approx(0.8 * F / r.fp8_matmul_flops_per_s + R.matmul_s(fused, fused, r))
    # A target without fp8 GEMMs in the table (here: the CPU) prices them at its own rate.
    cpu = dataclasses.replace(r, fp8_matmul_flops_per_s=0.0)
    assert R.matmul_s(F, 0.0, cpu, fp8_share=s) == R.matmul_s(F, 0.0, cpu)


@pytest.mark.slow  # a deviceless compile of the full 8B step: about a minute here
def test_deviceless_h200_compile_holds_fp8_gemms_and_the_model_peak_is_within_10_percent():
    """Llama 3 8B, 2 × 4096 per device on 8 H200s (fsdp=8), plan minimal: XLA's program holds the
    layer's fp8 GEMMs — 7 projections forward, 2 × 7 backward (each input's gradient), none
    for attention's scores or the LM head — and fits, the model's peak within 10 % of XLA's."""
    from tierax.mesh import MeshShape
    from tierax.models import for_platform
    from tierax.xla import compile as C

    try:
        C.check_gpu_aot()
    except TieraxError as e:
        pytest.skip(str(e))
    cfg = for_platform(_fp8("llama3-8b"), "gpu")
    r, text = C.compile_for_target(
        cfg, plan_lib.preset("minimal", cfg), "h200", microbatch=2, seq=4096,
        mesh=MeshShape(fsdp=8),
    )  # fmt: skip
    assert r.fp8_gemms == 7 + 2 * 7, r.notes
    assert r.fits and r.quantization == "fp8"
    model = r.predicted["peak_device_bytes"]
    assert abs(model - r.device_peak_bytes) <= 0.10 * r.device_peak_bytes


def test_cli_says_fp8_runs_emulated_where_there_are_no_fp8_gemms(cli):
    """A TPU target (no fp8 rate in the table) and the local CPU backend both say so; a GPU
    target does not."""
    args = ["--model", "tiny-llama", "--set", "quantization=fp8", "--microbatch", "2"]
    r = cli("plan", *args, "--seq", "32", "--target", "v5e")
    assert r.returncode == 0 and "quantization=fp8 on v5e (tpu)" in r.stderr
    assert "emulated" in r.stderr
    r = cli("plan", *args, "--seq", "32", "--target", "h200")
    assert r.returncode == 0 and "emulated" not in r.stderr
    # v7x lists fp8 MXU rates (Cloud TPU7x docs): priced as fp8 GEMMs, no note
    r = cli("plan", *args, "--seq", "128", "--target", "v7x", "--devices", "8")
    assert r.returncode == 0 and "emulated" not in r.stderr, r.stderr[-1000:]
    from tierax.costmodel import rates as R

    v7x = R.target_rates("v7x", "bfloat16", calibration={})
    # the bf16 GEMMs' share of the peak measured on a v5e chip, assumed for fp8, of a device's
    # 2307 TFLOP/s fp8 peak (tests/test_tpu_kernel_rates.py pins the share to its record)
    share = v7x.matmul_flops_per_s / (2307e12 / 2)
    assert v7x.fp8_matmul_flops_per_s == pytest.approx(4614e12 / 2 * share, rel=1e-12)
    assert "assumed for fp8" in v7x.sources["fp8_matmul"]


def test_fp8_state_is_replicated_and_weights_keep_their_sharding():
    from tierax.sharding import rules

    class Key:  # a path entry as jax's tree paths give it
        def __init__(self, key):
            self.key = key

    mesh = {"data": 1, "fsdp": 8, "tensor": 2, "expert": 1}
    path = [Key("groups"), Key("decoder"), Key("attention"), Key("wq")]
    hist = rules.param_spec([*path, Key("fp8_input_history")], (4, N), mesh)
    kernel = rules.param_spec([*path, Key("kernel")], (4, 64, 64), mesh)
    assert hist == jax.sharding.PartitionSpec() and kernel != jax.sharding.PartitionSpec()


HLO = """HloModule m

%fused (p0: f8e4m3fn[4,8], p1: f8e5m2[8,2]) -> f32[4,2] {
  %p0 = f8e4m3fn[4,8]{1,0} parameter(0)
  %p1 = f8e5m2[8,2]{1,0} parameter(1)
  ROOT %d = f32[4,2]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f8e4m3fn[4,8], b: f8e5m2[8,2], c: bf16[4,8], e: bf16[8,2]) -> f32[4,2] {
  %a = f8e4m3fn[4,8]{1,0} parameter(0)
  %b = f8e5m2[8,2]{1,0} parameter(1)
  %c = bf16[4,8]{1,0} parameter(2)
  %e = bf16[8,2]{1,0} parameter(3)
  %f = f32[4,2]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused
  %g = bf16[4,2]{1,0} dot(%c, %e), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %h = (f32[4,2]{1,0}, s8[0]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul$f8"
  ROOT %r = f32[4,2]{1,0} add(%f, %f)
}
"""


def test_fp8_gemms_counted_in_hlo_text():
    from tierax.xla import hlo

    none = {"block_scaled": 0, "block_scaled_unrewritten": 0}
    assert hlo.fp8_gemms(hlo.parse_module(HLO)) == {"cublaslt": 1, "dot": 1, **none}
    # The same program with the cuBLASLt call made a bf16 one and the fusion's operands bf16.
    other = HLO.replace("$matmul$f8", "$matmul")
    other = other.replace("f8e4m3fn", "bf16").replace("f8e5m2", "bf16")
    assert hlo.fp8_gemms(hlo.parse_module(other)) == {"cublaslt": 0, "dot": 0, **none}


def test_the_steps_compute_prices_the_fp8_share_at_the_fp8_rate():
    """The step's forward and backward matmuls (not only the recomputation): a group whose traced
    fp8 share is 0.9 runs 0.9 of its 3 × forward FLOPs at the fp8 rate, the rest (and the LM head,
    never fp8) at the compute dtype's."""
    from tierax import costmodel as cm
    from tierax import names as N
    from tierax.costmodel import rates as R
    from tierax.tracing.inventory import Activation, GroupInventory, Inventory

    cfg = get_config("tiny-llama")
    g = GroupInventory(
        "decoder",
        2,
        (Activation("decoder", N.DECODER_LAYER_INPUT, 1000, 2, 0.0),),
        carry_bytes_per_layer=1000,
        save_all_bytes_per_layer=2000,
        base_recompute_flops_per_layer=0.0,
        forward_flops_per_layer=1e12,
        layer_param_count=1000,
        fp8_flops_share=0.9,
    )
    inv = Inventory("hand", 4, 64, {"fsdp": 1}, (g,), 0, 0, 0, 0, 0)
    r = R.target_rates("h200", "bfloat16", calibration={})
    fx = cm.fixed_terms(for_inventory(cfg, inv), r, "serial")
    head = 3 * 2.0 * 4 * 64 * cfg.d_model * cfg.vocab_size
    fp8 = 3 * 0.9 * 2e12
    want = (3 * 2e12 + head - fp8) / r.matmul_flops_per_s + fp8 / r.fp8_matmul_flops_per_s
    assert fx.compute_s - fx.hbm_s == pytest.approx(want, rel=1e-12)
    bf16 = cm.fixed_terms(
        for_inventory(
            cfg, dataclasses.replace(inv, groups=(dataclasses.replace(g, fp8_flops_share=0.0),))
        ),
        r,
        "serial",
    )
    assert fx.compute_s < bf16.compute_s


def test_the_fp8_rate_is_a_rate_key_and_prices_the_fp8_gemms():
    """``--rate fp8_matmul=T`` sets the fp8 GEMM rate, names itself as its source, and halving
    it doubles the fp8 part of a matmul's time exactly (hand computed)."""
    from tierax.costmodel import rates as R

    base = R.target_rates("h200", "bfloat16")
    r = R.override_rates(base, ["fp8_matmul=500"])
    assert r.fp8_matmul_flops_per_s == 500e12 and r.matmul_flops_per_s == base.matmul_flops_per_s
    assert r.sources["fp8_matmul"].startswith("--rate fp8_matmul=500")
    flops = 1e15
    t = R.matmul_s(flops, 0.0, r, fp8_share=0.5)
    assert t == pytest.approx(0.5 * flops / 500e12 + 0.5 * flops / base.matmul_flops_per_s)
