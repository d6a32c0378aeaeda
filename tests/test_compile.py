"""Deviceless GPU compilation (needs the gpu-aot extra, which `make test` installs)."""

import dataclasses
import json
import pathlib
import subprocess
import sys
import warnings

import jax
import pytest

from tierax import hardware
from tierax import plan as P
from tierax.errors import TieraxError
from tierax.mesh import MeshShape
from tierax.models import get_config
from tierax.tracing.model_program import for_inventory
from tierax.xla import compile as C
from tierax.xla import hlo

TARGETS = pathlib.Path(__file__).resolve().parent / "fixtures" / "gpu-targets"


def _lines(text):
    return [line.strip() for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "key, fname", [("h100", "h100_sxm"), ("h200", "h200"), ("b200", "b200"), ("gb200", "gb200")]
)
def test_rendered_target_config_equals_the_checked_files(key, fname):
    ref = TARGETS / f"{fname}.jaxlib-0.10.2.txtpb"
    assert _lines(hardware.render_target_config(hardware.TARGETS[key])) == _lines(ref.read_text())


def test_hardware_table_is_consistent():
    for spec in hardware.TARGETS.values():
        assert spec.host_link_bps <= spec.host_link_theory_bps
        assert spec.peak("bfloat16") > spec.peak("float32") > 0
        assert spec.device_memory_bytes > 80e9


def qkv_residual_bytes(cfg, batch, seq):
    """Offloaded q/k/v residual bytes, from the config's shapes alone."""
    itemsize = 4 if cfg.dtype == "float32" else 2
    per_layer = batch * seq * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim * itemsize
    return cfg.num_layers * per_layer


@pytest.fixture(scope="module")
def tiny_llama_offload_vs_device():
    # Enough layers that the residuals, not per-layer staging buffers, dominate temp memory.
    cfg = dataclasses.replace(get_config("tiny-llama"), num_layers=12)
    # XLA's offload policy: the schedule facts asserted below are its (tests/test_prefetch.py: the
    # prefetching scan's).
    offload = dataclasses.replace(P.preset("qkv-offload", cfg), mechanism="policy")
    # Same plan with the offloaded names moved to device.
    groups = {
        g: P.GroupPlan(
            {
                n: (P.Placement.DEVICE if p is P.Placement.OFFLOAD else p)
                for n, p in gp.placements.items()
            },
            gp.default,
        )
        for g, gp in offload.groups.items()
    }
    on_device = P.Plan("qkv-device", groups)
    # The target config given (h200's own, as rendered): test_fits_leaves_the_runtime_reserve_free
    # compiles this step again with it, identically, against a smaller device.
    a, text = C.compile_for_target(
        cfg, offload, "h200", microbatch=8, seq=64, target_config=_H200_CONFIG
    )
    b, _ = C.compile_for_target(cfg, on_device, "h200", microbatch=8, seq=64)
    return cfg, a, b, text


_H200_CONFIG = hardware.render_target_config(hardware.TARGETS["h200"])


def test_host_temp_equals_offloaded_residuals(tiny_llama_offload_vs_device):
    cfg, off, on_dev, _ = tiny_llama_offload_vs_device
    expected = qkv_residual_bytes(cfg, 8, 64)
    assert off.host_temp_bytes == expected
    # Per name, from the shapes: L × batch × seq × heads × head_dim × 4 bytes (q: 4 heads, k and v:
    # 2 each).
    b, s, hd, L = 8, 64, cfg.head_dim, cfg.num_layers
    assert (cfg.num_heads, cfg.num_kv_heads, hd, L) == (4, 2, 16, 12)
    assert off.offloaded_bytes_by_name == {
        "query_proj": L * b * s * 4 * hd * 4,
        "key_proj": L * b * s * 2 * hd * 4,
        "value_proj": L * b * s * 2 * hd * 4,
    }
    assert off.offloaded_bytes_by_name["query_proj"] == 12 * 8 * 64 * 64 * 4 == 1_572_864
    assert all(o.on_host for o in off.offloaded) and len(off.offloaded) == 3
    # Moving them to device removes the host bytes and puts (nearly) all of them in device temp.
    assert on_dev.host_temp_bytes == 0 and on_dev.offloaded == ()
    assert on_dev.device_temp_bytes - off.device_temp_bytes >= 0.8 * expected
    assert off.fits and off.device_peak_bytes == (
        off.device_argument_bytes
        + off.device_output_bytes
        + off.device_temp_bytes
        - off.device_alias_bytes
    )


def test_simulate_host_bytes_equal_the_compiled_program(tiny_llama_offload_vs_device):
    """The cost model's host bytes against XLA's deviceless GPU compile of the same plan:
    exactly."""
    from tierax import costmodel as cm
    from tierax.tracing.inventory import model_inventory

    cfg, off, on_dev, _ = tiny_llama_offload_vs_device
    inv = model_inventory(cfg, 8, 64)
    rates = cm.target_rates("h200", cfg.dtype)
    policy = dataclasses.replace(P.preset("qkv-offload", cfg), mechanism="policy")
    assert (
        cm.simulate(policy, for_inventory(cfg, inv), rates, "lhs").host_bytes
        == off.host_temp_bytes
        > 0
    )
    # tierax's prefetching scan (the default): q/k/v, made before the attention, stored in their
    # own layer (all 12 on the host); the MLP's up-projection a layer later (11 of 12)
    prefetch = P.preset("qkv-offload", cfg)
    compiled, _ = C.compile_for_target(cfg, prefetch, "h200", microbatch=8, seq=64)
    assert compiled.host_temp_bytes == off.host_temp_bytes
    assert (
        cm.simulate(prefetch, for_inventory(cfg, inv), rates, "lhs").host_bytes
        == compiled.host_temp_bytes
    )
    later = P.Plan(
        "mlp-offload",
        {"decoder": P.GroupPlan({"mlpwi_0": P.Placement.OFFLOAD}, P.Placement.REMAT)},
    )
    compiled, _ = C.compile_for_target(cfg, later, "h200", microbatch=8, seq=64)
    per_layer = 8 * 64 * cfg.mlp_dim * 4
    assert compiled.host_temp_bytes == 11 * per_layer
    assert (
        cm.simulate(later, for_inventory(cfg, inv), rates, "lhs").host_bytes
        == compiled.host_temp_bytes
    )
    on_device = P.Plan(
        "qkv-device",
        {
            g: P.GroupPlan(
                {
                    n: (P.Placement.DEVICE if p is P.Placement.OFFLOAD else p)
                    for n, p in gp.placements.items()
                },
                gp.default,
            )
            for g, gp in P.preset("qkv-offload", cfg).groups.items()
        },
    )
    assert (
        cm.simulate(on_device, for_inventory(cfg, inv), rates, "lhs").host_bytes
        == on_dev.host_temp_bytes
        == 0
    )


def test_overlap_check_counts_every_transfer(tiny_llama_offload_vs_device):
    cfg, off, on_dev, text = tiny_llama_offload_vs_device
    ov = off.overlap
    # One store and one load of each offloaded name per layer.
    assert ov["transfers"] == 2 * 3 * cfg.num_layers
    assert ov["by_direction"]["d2h"]["transfer_bytes"] == off.host_temp_bytes
    assert ov["by_direction"]["h2d"]["transfer_bytes"] == off.host_temp_bytes
    assert ov["est_transfer_s"] == pytest.approx(
        2 * off.host_temp_bytes / hardware.TARGETS["h200"].host_link_bps
    )
    # Hand-computed link time: 2 directions × 12 layers × (8·64·(4+2+2)·16·4 B) at 55 GB/s.
    assert ov["est_transfer_s"] == pytest.approx(2 * 12 * (8 * 64 * 8 * 16 * 4) / 55e9)
    # What the schedule does (XLA:GPU, jaxlib 0.10.2, pipelining off): stores overlap the forward
    # loop's matmuls; each load sits at the top of the backward iteration that consumes it,
    # overlapping no matmul.
    d2h, h2d = ov["by_direction"]["d2h"], ov["by_direction"]["h2d"]
    assert d2h["est_exposed_s"] < 0.5 * d2h["est_transfer_s"]
    assert h2d["est_exposed_s"] > 0.5 * h2d["est_transfer_s"]
    for part in (ov, d2h, h2d):  # the three figures the compile table prints add up
        assert part["est_hidden_s"] + part["est_exposed_s"] == pytest.approx(part["est_transfer_s"])
    assert on_dev.overlap["transfers"] == 0
    module = hlo.parse_module(text)
    assert sum(1 for ins in module.by_name.values() if ins.opcode == "while") >= 2


def test_fsdp8_reports_per_device_figures():
    cfg = get_config("tiny-llama")
    r, _ = C.compile_for_target(
        cfg, P.preset("remat-full", cfg), "h200", microbatch=2, seq=64, mesh=MeshShape(fsdp=8)
    )
    assert r.devices == 8
    state_bytes = C.param_and_optimizer_bytes(cfg)  # params + two Adam moments, all divisible by 8
    tokens_bytes = 2 * 65 * 4
    assert r.device_argument_bytes == pytest.approx(
        state_bytes / 8 + tokens_bytes, rel=0.01, abs=64
    )


def test_rejected_target_config_names_the_field():
    cfg = get_config("tiny-llama")
    # A field no jaxlib's GpuTargetConfigProto has (jaxlib 0.10.2 also rejected
    # collective_memory_granularity, which 0.12 knows).
    text = hardware.render_target_config(hardware.TARGETS["h200"]).replace(
        "  core_count: 132", "  core_count: 132\n  tierax_no_such_field: 1"
    )
    with pytest.raises(TieraxError, match="tierax_no_such_field"):
        C.compile_for_target(
            cfg, P.preset("remat-full", cfg), "h200", microbatch=1, seq=8, target_config=text
        )


def test_missing_extra_gives_the_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("jax_plugins") else real(name, *a),
    )
    with pytest.raises(TieraxError, match=r"pip install \"jax\[cuda13-local\]=="):
        C.check_gpu_aot()


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "tierax.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--target", "h300"], "unknown target 'h300'"),
        (["--devices", "8", "--mesh", "fsdp=3"], "make the mesh product equal the device count"),
        (["--mesh", "tensor=8"], "num_heads=4 is not divisible by tensor=8"),
        (["--target-config", "/nonexistent.txtpb"], "no such file"),
    ],
)
def test_compile_cli_bad_input_exits_2(args, fragment):
    r = _cli("compile", "--model", "tiny-llama", *args)
    assert r.returncode == 2, r.stderr
    assert fragment in r.stderr and "Traceback" not in r.stderr


def test_compile_cli_rejected_field_exits_2(tmp_path):
    f = tmp_path / "bad.txtpb"
    f.write_text(
        hardware.render_target_config(hardware.TARGETS["h100"]).replace(
            "  core_count: 132", "  core_count: 132\n  cub_version: 3"
        )
    )
    r = _cli(
        "compile",
        "--model",
        "tiny-llama",
        "--plan",
        "remat-full",
        "--target",
        "h100",
        "--target-config",
        str(f),
        "--seq",
        "8",
        "--microbatch",
        "1",
    )
    assert r.returncode == 2 and "cub_version" in r.stderr
    assert "without that field (or with it fixed) as --target-config" in r.stderr  # what to do


POLICY_QKV = """plan: qkv-offload-policy
mechanism: policy
groups:
  decoder:
    default: remat
    decoder_layer_input: device
    query_proj: offload
    key_proj: offload
    value_proj: offload
"""


@pytest.mark.slow  # two deviceless GPU compiles of one step
def test_pipelined_preset_changes_the_schedule(tmp_path):
    """The XLA presets are applied before the backend starts: one process per preset (XLA's own
    offloader, the mechanism lhs-pipelined is offered with)."""
    plan = tmp_path / "policy.yaml"
    plan.write_text(POLICY_QKV)
    out = {}
    for preset in ("none", "lhs-pipelined"):
        r = _cli(
            "compile",
            "--model",
            "tiny-llama",
            "--set",
            "num_layers=6",
            "--plan",
            str(plan),
            "--json",
            "--xla-preset",
            preset,
        )
        assert r.returncode == 0, r.stderr
        out[preset] = json.loads(r.stdout)
    keys = {
        "target",
        "devices",
        "fits",
        "device_peak_bytes",
        "device_capacity_bytes",
        "device_temp_bytes",
        "host_temp_bytes",
        "offloaded_bytes_by_name",
        "overlap",
        "compile_time_s",
    }
    assert keys <= set(out["none"])
    assert out["none"]["host_temp_bytes"] == out["lhs-pipelined"]["host_temp_bytes"] > 0
    # Pipelined host offloading keeps transfers in flight across layers: more device staging memory.
    assert out["lhs-pipelined"]["device_temp_bytes"] > out["none"]["device_temp_bytes"]
    assert out["lhs-pipelined"]["overlap"]["est_hidden_s"] != out["none"]["overlap"]["est_hidden_s"]


@pytest.mark.parametrize(
    "verb",
    [
        ["compile", "--plan", "qkv-offload", "--xla-preset", "lhs-pipelined"],
        ["simulate", "--plan", "qkv-offload", "--schedule", "lhs-pipelined", "--target", "h200"],
        ["plan", "--schedule", "lhs-pipelined", "--target", "h200"],
        ["verify", "--plan", "qkv-offload", "--xla-preset", "lhs-pipelined"],
    ],
)
def test_prefetch_is_not_offered_with_lhs_pipelined(verb, cli):
    """XLA's pipelined host offloading does not hide the prefetching scan's stores
    (bench/results/hide_grid.json): every verb that would run or plan that pair exits 2 first.
    simulate and plan (which set no XLA flag) in this process; compile and verify, which set the
    preset's flags at start-up, in a new one."""
    run = cli if verb[0] in ("simulate", "plan") else _cli
    r = run(*verb[:1], "--model", "tiny-llama", *verb[1:])
    assert r.returncode == 2, r.stderr
    assert (
        "not offered with the 'lhs-pipelined' preset" in r.stderr
        and "mechanism: policy" in r.stderr
    )


def test_lhs_pipelined_still_runs_plans_without_offload(cli):
    """A plan that offloads nothing runs no mechanism: lhs-pipelined stays available to it."""
    r = cli(
        "simulate", "--model", "tiny-llama", "--plan", "remat-full", "--schedule", "lhs-pipelined"
    )
    assert r.returncode == 0, r.stderr


def test_fits_leaves_the_runtime_reserve_free(monkeypatch, tiny_llama_offload_vs_device):
    """A compiled peak between the usable limit (capacity less the runtime reserve) and the raw
    capacity does not fit.  The fixture's offload program is compiled again (the same target
    config, given explicitly as the fixture gives it), judged against a capacity just above its
    peak.

    That compile is the fixture's step compiled again, identically, under JAX's persistent
    compilation cache (conftest): it must not load the first compile's entry back, which a
    compile-only client cannot (JAX warns and compiles anyway)."""
    cfg, off, _, _ = tiny_llama_offload_vs_device
    spec = hardware.TARGETS["h200"]
    peak = off.device_peak_bytes
    assert off.fits and off.device_capacity_bytes == spec.device_memory_bytes
    tight = int(peak / (1 - hardware.RUNTIME_RESERVE_FRACTION / 2))  # peak < capacity, > usable
    monkeypatch.setitem(
        hardware.TARGETS, "h200", dataclasses.replace(spec, device_memory_bytes=tight)
    )
    assert jax.config.jax_compilation_cache_dir and jax.config.jax_enable_compilation_cache
    plan = dataclasses.replace(P.preset("qkv-offload", cfg), mechanism="policy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again, _ = C.compile_for_target(
            cfg, plan, "h200", microbatch=8, seq=64, target_config=_H200_CONFIG
        )
    assert not [str(w.message) for w in caught if "compilation cache" in str(w.message)]
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0  # restored (conftest: 0)
    assert again.device_peak_bytes == peak < again.device_capacity_bytes == tight
    assert not again.fits


def test_over_budget_gpu_compile_is_a_result_with_the_prediction():
    """XLA:GPU compiles a program larger than the device (it does not refuse one): `compile --json`
    reports fits false against capacity less the runtime reserve, with the model's prediction, exit
    0.  (The TPU counterpart, where XLA refuses the program, is in tests/test_tpu.py.)"""
    r = _cli(
        "compile",
        "--model",
        "llama3-8b",
        "--set",
        "num_layers=2",
        "--set",
        "d_model=256",
        "--set",
        "num_heads=4",
        "--set",
        "num_kv_heads=2",
        "--set",
        "head_dim=64",
        "--set",
        "mlp_dim=896",
        "--set",
        "vocab_size=4096",
        "--set",
        "attention=xla",
        "--plan",
        "remat-full",
        "--target",
        "h200",
        "--microbatch",
        "64",
        "--seq",
        "8192",
        "--json",
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert not out["fits"] and not out["out_of_memory"]
    h200 = hardware.get_target("h200")
    assert out["device_limit_bytes"] == hardware.usable_bytes(h200.device_memory_bytes)
    assert out["device_peak_bytes"] > out["device_limit_bytes"]
    assert out["predicted"]["fits"] is False
    assert out["predicted"]["peak_device_bytes"] > out["device_limit_bytes"]


def _layer_input_offload():
    return P.Plan(
        "lin-offload",
        {"decoder": P.GroupPlan({"decoder_layer_input": P.Placement.OFFLOAD})},
        mechanism="policy",
    )


# XLA's compile of the layer input offloaded alone (the default suite compiles it beside mlpwo in
# test_an_offloaded_mlpwo_holds_nothing_on_host_as_xla_compiles_it: the same host temp, the carry,
# and no line of src/tierax this one runs that that one does not).
@pytest.mark.slow
def test_an_offloaded_layer_input_leaves_the_device_as_xla_places_it():
    """MaxText's recipes offload decoder_layer_input (the scan's carry).  XLA's host offloader puts
    every layer's carry in host memory: L × b·s·d·4 B of host temp."""
    cfg = get_config("tiny-llama")
    r, _ = C.compile_for_target(cfg, _layer_input_offload(), "h200", microbatch=2, seq=64)
    assert r.host_temp_bytes == cfg.num_layers * 2 * 64 * cfg.d_model * 4


def test_an_offloaded_layer_input_is_host_bytes_not_device_bytes():
    """The carry XLA puts on the host (L × b·s·d·4 B: the compiles above and below) the model
    counts as host bytes, and no longer as device bytes; it used to count none."""
    from tierax import costmodel as cm
    from tierax.tracing.inventory import model_inventory

    cfg = get_config("tiny-llama")
    plan = _layer_input_offload()
    carry = cfg.num_layers * 2 * 64 * cfg.d_model * 4
    inv = model_inventory(cfg, 2, 64)
    rates = cm.target_rates("h200", cfg.dtype)
    off = cm.simulate(plan, for_inventory(cfg, inv), rates, "lhs")
    kept = dataclasses.replace(
        plan, groups={"decoder": P.GroupPlan({"decoder_layer_input": P.Placement.DEVICE})}
    )
    on = cm.simulate(kept, for_inventory(cfg, inv), rates, "lhs")
    assert off.host_bytes == carry and on.host_bytes == 0
    assert on.breakdown.activation_bytes - off.breakdown.activation_bytes == carry
    assert off.breakdown.transfer_s == pytest.approx(
        carry / rates.d2h_bytes_per_s + carry / rates.h2d_bytes_per_s
    )


def test_an_offloaded_mlpwo_holds_nothing_on_host_as_xla_compiles_it():
    """MaxText's Llama 3.1 405B recipe on v7x offloads ``mlpwo`` with the layer input.  The
    down-projection's output only feeds the residual add, so the backward never reads it: XLA's
    deviceless compile holds the carries alone in host temp (L × b·s·d·4 B), and the model's host
    bytes are the same — it used to add L × b·s·d·4 B more for mlpwo (a 405B run's 94.5 GiB more
    per device than the v7x host has)."""
    from tierax import costmodel as cm
    from tierax.tracing.inventory import model_inventory

    cfg = get_config("tiny-llama")
    plan = P.Plan(
        "lin-mlpwo-offload",
        {
            "decoder": P.GroupPlan(
                {"decoder_layer_input": P.Placement.OFFLOAD, "mlpwo": P.Placement.OFFLOAD}
            )
        },
        mechanism="policy",
    )
    r, _ = C.compile_for_target(cfg, plan, "h200", microbatch=2, seq=64)
    carry = cfg.num_layers * 2 * 64 * cfg.d_model * 4
    assert r.host_temp_bytes == carry
    inv = model_inventory(cfg, 2, 64)
    pred = cm.simulate(plan, for_inventory(cfg, inv), cm.target_rates("h200", cfg.dtype), "lhs")
    assert pred.host_bytes == carry
