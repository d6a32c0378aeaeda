#!/usr/bin/env python3
"""Deliberate breakage: does the test suite catch it?

Each mutation below is one wrong change to tierax (issue 11's table; issue 25's time-model ones
after it).  For each, a
temporary copy of the repository (``git archive`` of a commit: src/, tests/, data/ (the
tokenizer tests' sample text), pyproject.toml) is patched and the relevant test files run against it
(``PYTHONPATH`` = the copy's src/).  A mutation is *caught* when a test that passes on
the unpatched copy fails on the patched one; tests that already fail unpatched (someone
else's work in progress) are reported and never count.  Writes
bench/results/mutations.json.  Not part of the default suite (several minutes).

    .venv/bin/python bench/mutations.py [--commit HEAD] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

import _common

ROOT = pathlib.Path(__file__).resolve().parents[1]

MUTATIONS = [
    {
        "name": "to_policies-keeps-offloaded-on-device",
        "what": "plan.to_policies saves offloaded names in device memory instead of offloading "
        "them",
        "file": "src/tierax/plan/policies.py",
        "old": "if p is Placement.DEVICE and n != N.DECODER_LAYER_INPUT\n        ],\n        "
        "names_which_can_be_offloaded=[n for n, p in placements.items() if p is "
        "Placement.OFFLOAD],",
        "new": "if p in (Placement.DEVICE, Placement.OFFLOAD) and n != N.DECODER_LAYER_INPUT\n     "
        "   ],\n        names_which_can_be_offloaded=[],",
        "tests": ["tests/test_plan.py"],
    },
    {
        "name": "planner-ignores-exposed-transfer",
        "what": "the planner's objective gives exposed transfer time no weight",
        "file": "src/tierax/solving/planner.py",
        "old": "    c[ED:S] = c[EC] = A * (1 - slow)\n",
        "new": "    c[ED:S] = 0.0\n    c[EC] = A * (1 - slow)\n",
        "tests": ["tests/test_planner_bruteforce.py", "tests/test_planner.py"],
    },
    {
        "name": "host-transfers-cost-nothing",
        "what": "costmodel.item_terms: d2h and h2d seconds are 0",
        "file": "src/tierax/costmodel/terms.py",
        "old": "a.host_held_bytes_per_layer * g.num_layers / rates.d2h_bytes_per_s,\n"
        "                    (\n"
        "                        a.host_held_bytes_per_layer * g.num_layers\n"
        "                        + spare_loads(g.name, a.name, mechanism)"
        " * a.host_held_bytes_per_layer\n"
        "                    )\n"
        "                    / rates.h2d_bytes_per_s,",
        "new": "0.0,\n                    0.0,",
        "tests": [
            "tests/test_costmodel_hand.py",
            "tests/test_planner_bruteforce.py",
            "tests/test_planner.py",
        ],
    },
    {
        "name": "verify-compares-reference-with-itself",
        "what": "verify never runs the plan's program: the plan's loss and gradients are the "
        "reference's",
        "file": "src/tierax/measure/verify.py",
        "old": "        loss, grads = compiled_step(graphdef, p, cfg, params, tokens, jmesh)"
        "(params, tokens)\n",
        "new": "        loss, grads = ref_loss, ref_grads\n",
        "tests": ["tests/test_verify.py"],
    },
    # Issue 24's four, which the suite then let through, and the same gap in compile's fits.
    {
        "name": "plan-check-correction-wrong-sign",
        "what": "plan --check adds XLA's miss to the next solve's budget instead of taking it off",
        "file": "src/tierax/solving/plan_check.py",
        "old": "solve_budget = min(budget - correction, limit, load_cap)",
        "new": "solve_budget = min(budget + correction, limit, load_cap)",
        "tests": ["tests/test_plan_check.py"],
    },
    {
        "name": "prediction-fits-without-the-reserve",
        "what": "Prediction.fits compares the peak with the raw capacity (no runtime reserve)",
        "file": "src/tierax/costmodel/predict.py",
        "old": "fits=assigned_peak <= rates.usable_device_bytes and host",
        "new": "fits=assigned_peak <= rates.device_memory_bytes and host",
        "tests": ["tests/test_costmodel_hand.py"],
    },
    {
        "name": "compile-fits-without-the-reserve",
        "what": "CompileResult.fits compares XLA's peak with the raw capacity (no runtime reserve)",
        "file": "src/tierax/hardware/targets.py",
        "old": "or usable_bytes(spec.device_memory_bytes)",
        "new": "or spec.device_memory_bytes",
        "tests": ["tests/test_compile.py"],
    },
    {
        "name": "emit-maxtext-offloaded-mlpwo-as-device",
        "what": "--emit maxtext writes mlpwo: device where the plan offloads mlpwo",
        "file": "src/tierax/interop/maxtext.py",
        "old": 'remat = {k: placements[k].value if k in placements else "remat" '
        "for k in K.REMAT_KEYS}",
        "new": 'remat = {k: ("device" if k == "mlpwo" and placements[k] is Placement.OFFLOAD '
        'else placements[k].value) if k in placements else "remat" for k in K.REMAT_KEYS}',
        "tests": ["tests/test_maxtext.py"],
    },
    {
        "name": "planned-segment-boundary-shifted-by-one",
        "what": "a planned split at layer k makes segments 0..k and k+1..n-1 (one layer late)",
        "file": "src/tierax/solving/planner.py",
        "old": "for a, b in ((0, k), (k, g.num_layers))",
        "new": "for a, b in ((0, k + 1), (k + 1, g.num_layers))",
        "tests": ["tests/test_segments.py"],
    },
    # The time model on a calibrated CPU (issue 25; tests/test_time_model.py).
    {
        "name": "cpu-matmul-rate-float32-for-every-dtype",
        "what": "target cpu prices every compute dtype's matmuls at the float32 calibrated rate",
        "file": "src/tierax/costmodel/rates.py",
        "old": '    matmul = cal.get(key, cal.get("matmul_flops_per_s"))\n',
        "new": '    matmul = cal.get("matmul_flops_per_s")\n',
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "calibration-does-not-reach-simulate",
        "what": "target_rates ignores the calibration (file or argument): a fixed 135 GFLOP/s",
        "file": "src/tierax/costmodel/rates.py",
        "old": "    cal = (load_calibration() if calibration is None else calibration)"
        ".get(target, {})\n",
        "new": '    cal = {"matmul_flops_per_s": 135e9}\n',
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "cpu-nonmatmul-rate-not-calibrated",
        "what": "target cpu ignores the calibrated non-matmul rate (a fixed 10 GB/s)",
        "file": "src/tierax/costmodel/rates.py",
        "old": '        bandwidth = cal["memory_bytes_per_s"]\n',
        "new": "        bandwidth = 10e9\n",
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "cpu-transpose-rate-not-calibrated",
        "what": "target cpu ignores the calibrated transposing-fusion rate (no such term)",
        "file": "src/tierax/costmodel/rates.py",
        "old": '    transpose = cal.get("transpose_read_elems_per_s", 0.0)\n',
        "new": "    transpose = 0.0\n",
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "recompute-term-dropped",
        "what": "costmodel.evaluate: the step time leaves out the recomputation",
        "file": "src/tierax/costmodel/predict.py",
        "old": "micro = fx.compute_s + recompute + exposed + transpose",
        "new": "micro = fx.compute_s + exposed + transpose",
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "memory-traffic-term-dropped",
        "what": "costmodel.fixed: compute time is the matmuls alone (no non-matmul memory traffic)",
        "file": "src/tierax/costmodel/fixed.py",
        "old": "compute_s = layers_s + head_rest_s + fp8_s + head_s + fused_s + hbm_s",
        "new": "compute_s = layers_s + head_rest_s + fp8_s + head_s + fused_s",
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "gemm-size-interpolated-linearly",
        "what": "costmodel.Rates: the CPU GEMM rate curve is interpolated linearly in dimension",
        "file": "src/tierax/costmodel/rates.py",
        "old": "t = math.log(dim / d0) / math.log(d1 / d0)",
        "new": "t = (dim - d0) / (d1 - d0)",
        "tests": ["tests/test_gemm_size_rates.py"],
    },
    {
        "name": "gemm-batch-dims-counted-as-rows",
        "what": "jaxpr_tools.gemm_min_dim: a batched matmul's batch dimensions count as its M",
        "file": "src/tierax/tracing/jaxpr_tools.py",
        "old": "m = math.prod(d for i, d in enumerate(lhs) if i not in lc and i not in lb)",
        "new": "m = math.prod(d for i, d in enumerate(lhs) if i not in lc)",
        "tests": ["tests/test_gemm_size_rates.py"],
    },
    {
        "name": "first-touch-term-dropped",
        "what": "costmodel.evaluate: the step leaves out the first write of fresh memory (CPU)",
        "file": "src/tierax/costmodel/predict.py",
        "old": "+ update_s + adds) + first_touch + sc.exposed_s\n",
        "new": "+ update_s + adds) + sc.exposed_s\n",
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "planner-ignores-first-touch",
        "what": "the planner's objective gives the first write of fresh memory no weight",
        "file": "src/tierax/solving/planner.py",
        "old": "    if t.rates.first_touch_bytes_per_s:\n        # CPU",
        "new": "    if False:\n        # CPU",
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "transposing-fusion-term-dropped",
        "what": "costmodel.evaluate: the step leaves out XLA:CPU's transposing fusions",
        "file": "src/tierax/costmodel/predict.py",
        "old": "recompute + exposed + transpose + interference\n",
        "new": "recompute + exposed + interference\n",
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "planner-ignores-transposing-fusions",
        "what": "the planner's objective gives XLA:CPU's transposing fusions no weight",
        "file": "src/tierax/solving/planner.py",
        "old": "    per_micro = t.recompute_s + t.transpose_s + t.transfer_s * slow\n",
        "new": "    per_micro = t.recompute_s + t.transfer_s * slow\n",
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "transposed-reads-of-named-residuals-dropped",
        "what": "hbm.transposed_reads: a named residual's reads are not counted",
        "file": "src/tierax/tracing/hbm.py",
        "old": "            elif v in names:\n",
        "new": "            elif False:\n",
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "transposed-reads-stride-class-ignored",
        "what": "hbm.row_aliased: no row stride is a multiple of 4 KiB (every read spread)",
        "file": "src/tierax/tracing/hbm.py",
        "old": "    return (row_elems * jnp.dtype(dtype).itemsize) % PAGE_BYTES == 0\n",
        "new": "    return False\n",
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "cpu-aliased-transpose-rate-not-calibrated",
        "what": "target cpu prices aliased transposing reads at the spread rows' rate",
        "file": "src/tierax/costmodel/rates.py",
        "old": '    aliased = cal.get("transpose_aliased_read_elems_per_s", 0.0)\n',
        "new": "    aliased = 0.0\n",
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "aliased-transposing-reads-at-the-spread-rate",
        "what": "costmodel.transposes: aliased reads priced at the spread rows' rate",
        "file": "src/tierax/costmodel/transposes.py",
        "old": "        return spread / rate + aliased / aliased_rate\n",
        "new": "        return spread / rate + aliased / rate\n",
        "tests": ["tests/test_time_model.py"],
    },
    {
        "name": "mesh-time-bound-inflated",
        "what": "mesh_search: the time bound 1.5 x compute + exposed collectives (no longer under "
        "every placement's step)",
        "file": "src/tierax/solving/mesh_search.py",
        "old": "lower_bound_s=k * (fx.compute_s + fx.exposed_collective_s) - (k - 1) * update_s,",
        "new": "lower_bound_s=1.5 * k * (fx.compute_s + fx.exposed_collective_s),",
        "tests": ["tests/test_mesh_search.py"],
    },
    {
        "name": "mesh-state-bound-doubled",
        "what": "mesh_search: the state bound counts the state twice",
        "file": "src/tierax/solving/mesh_search.py",
        "old": "    return 2 * p + p * inv_lib.moment_bytes_per_param(cfg)",
        "new": "    return 4 * p + 2 * p * inv_lib.moment_bytes_per_param(cfg)",
        "tests": ["tests/test_mesh_search.py"],
    },
    {
        "name": "mesh-carry-bound-quadrupled",
        "what": "mesh_search: the carry bound counts each layer input four times",
        "file": "src/tierax/solving/mesh_search.py",
        "old": "    return microbatch * seq * cfg.d_model",
        "new": "    return 4 * microbatch * seq * cfg.d_model",
        "tests": ["tests/test_mesh_search.py"],
    },
    {
        "name": "sweep-bypasses-solve",
        "what": "whatif.request_solver calls the planner directly, not planning.solve",
        "file": "src/tierax/solving/whatif.py",
        "old": "            result, _ = planning.solve(req, inventories)",
        "new": "            result = planner.plan(prog, req.rates, schedule=req.schedule, "
        "budget_bytes=req.budget_bytes, host_budget_bytes=req.host_budget_bytes, "
        "segments=req.segments)",
        "tests": ["tests/test_planning.py"],
    },
    # Issue 40's audit gaps (each run against its own test file when written).
    {
        "name": "calibrate-gb200-as-b200",
        "what": "calibrate.target_key_for: a substring test, B200 before GB200 (a GB200's rates "
        "stored as b200)",
        "file": "src/tierax/hardware/device_kinds.py",
        "old": "    for word in words:\n        if word in _KIND_TO_TARGET:\n            return "
        "_KIND_TO_TARGET[word]\n",
        "new": "    for kind, key in _KIND_TO_TARGET.items():\n        if kind in "
        'device_kind.replace(" ", ""):\n            return key\n',
        "tests": ["tests/test_calibrate.py"],
    },
    {
        "name": "gpu-h2d-from-d2h-key",
        "what": "target_rates: the GPU host-to-device rate read from the d2h calibration key",
        "file": "src/tierax/costmodel/rates.py",
        "old": 'h2d = cal.get("h2d_bytes_per_s", spec.host_link_bps)',
        "new": 'h2d = cal.get("d2h_bytes_per_s", spec.host_link_bps)',
        "tests": ["tests/test_calibrate.py"],
    },
    {
        "name": "cpu-aliased-transpose-from-spread-key",
        "what": "_cpu_rates: aliased-row transposing reads priced at the spread rows' rate",
        "file": "src/tierax/costmodel/rates.py",
        "old": 'aliased = cal.get("transpose_aliased_read_elems_per_s", 0.0)',
        "new": 'aliased = cal.get("transpose_read_elems_per_s", 0.0)',
        "tests": ["tests/test_calibrate.py"],
    },
    {
        "name": "tpu-stack-copy-expert-twice",
        "what": "_tpu_stack_copy_bytes divides the expert stacks by expert twice",
        "file": "src/tierax/costmodel/fixed.py",
        "old": "+ g.expert_param_count_per_layer / (max(ep, 1) * n_efsdp)",
        "new": "+ g.expert_param_count_per_layer / (fsdp * max(ep, 1))",
        "tests": ["tests/test_tpu_stack_copy.py"],
    },
    {
        "name": "oom-counts-vmem",
        "what": "out_of_memory: a scoped-VMEM refusal (one fusion) read as the program's OOM",
        "file": "src/tierax/xla/oom.py",
        "old": 'if "RESOURCE_EXHAUSTED" not in text or "vmem" in text.lower():',
        "new": 'if "RESOURCE_EXHAUSTED" not in text:',
        "tests": ["tests/test_oom.py"],
    },
    {
        "name": "oom-decimal-gigabytes",
        "what": "out_of_memory reads libtpu's G as 10^9 bytes (it prints GiB)",
        "file": "src/tierax/xla/oom.py",
        "old": '"G": 2**30,',
        "new": '"G": 10**9,',
        "tests": ["tests/test_oom.py"],
    },
    {
        "name": "xla-flags-replace-the-users",
        "what": "configure replaces the user's XLA_FLAGS with the preset's",
        "file": "src/tierax/launch/flags.py",
        "old": 'os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *flags])'
        ".strip()",
        "new": 'os.environ["XLA_FLAGS"] = " ".join(flags).strip()',
        "tests": ["tests/test_flag_merge.py"],
    },
    {
        "name": "maxtext-context-not-multihost-gpu",
        "what": "MaxText's context is attention_out on tpu and gpu but not gpu_multiprocess",
        "file": "src/tierax/interop/maxtext_keys.py",
        "old": 'CONTEXT_HARDWARE = ("tpu", "gpu", "gpu_multiprocess")',
        "new": 'CONTEXT_HARDWARE = ("tpu", "gpu")',
        "tests": ["tests/test_maxtext.py"],
    },
    {
        "name": "attention-auto-head-dim-256-excluded",
        "what": "attention auto: a q/k head dim of 256 refused for cuDNN (the limit is inclusive)",
        "file": "src/tierax/models/config.py",
        "old": "if not (dqk % 8 == 0 and dqk <= 256 and dv <= dqk):",
        "new": "if not (dqk % 8 == 0 and dqk < 256 and dv <= dqk):",
        "tests": ["tests/test_attention_auto_bounds.py"],
    },
    {
        "name": "attention-auto-ignores-v-head-dim",
        "what": "attention auto: a v head dim above the q/k one still chooses cuDNN",
        "file": "src/tierax/models/config.py",
        "old": "if not (dqk % 8 == 0 and dqk <= 256 and dv <= dqk):",
        "new": "if not (dqk % 8 == 0 and dqk <= 256):",
        "tests": ["tests/test_attention_auto_bounds.py"],
    },
    {
        "name": "plan-check-one-iteration-short",
        "what": "plan --check compiles at most max_iterations - 1 times",
        "file": "src/tierax/solving/plan_check.py",
        "old": "    previous = None  # the placements compiled last\n    for it in range(1, "
        "max_iterations + 1):",
        "new": "    previous = None  # the placements compiled last\n    for it in range(1, "
        "max_iterations):",
        "tests": ["tests/test_plan_check_iterations.py"],
    },
    {
        "name": "plan-names-not-checked-against-the-model",
        "what": "resolve accepts any activation name (a typo in a plan is silently ignored)",
        "file": "src/tierax/plan/types.py",
        "old": "missing = list(dict.fromkeys(n for n in named if n not in valid))",
        "new": "missing = []",
        "tests": ["tests/test_api.py"],
    },
    {
        "name": "maxtext-emits-foreign-names",
        "what": "MaxText emission does not refuse names MaxText has no key for",
        "file": "src/tierax/interop/maxtext.py",
        "old": "    foreign = list(dict.fromkeys(n for n in named if n not in K.REMAT_KEYS))",
        "new": "    foreign = []",
        "tests": ["tests/test_api.py"],
    },
    {
        "name": "mesh-tokens-from-one-microstep",
        "what": "mesh_search: tokens/s from one microstep's time, not k microsteps'",
        "file": "src/tierax/solving/mesh_search.py",
        "old": "return None if self.result is None else tokens / self.step_time_s",
        "new": "return None if self.result is None else tokens / self.result.predicted.step_time_s",
        "tests": ["tests/test_mesh_accounting.py"],
    },
    {
        "name": "mesh-time-bound-per-microstep",
        "what": "mesh_search: the time bound of one microstep, not k",
        "file": "src/tierax/solving/mesh_search.py",
        "old": "lower_bound_s=k * (fx.compute_s + fx.exposed_collective_s) - (k - 1) * update_s,",
        "new": "lower_bound_s=fx.compute_s + fx.exposed_collective_s - (k - 1) * update_s,",
        "tests": ["tests/test_mesh_accounting.py"],
    },
    {
        "name": "mesh-collectives-per-microstep",
        "what": "mesh_search: a candidate's collectives of one microstep, not k",
        "file": "src/tierax/solving/mesh_search.py",
        "old": "collectives={g: k * s for g, s in",
        "new": "collectives={g: s for g, s in",
        "tests": ["tests/test_mesh_accounting.py"],
    },
    {
        "name": "mesh-accumulator-not-reserved",
        "what": "mesh_search: accumulation reserves no gradient accumulator",
        "file": "src/tierax/solving/mesh_search.py",
        "old": "accum_bytes = accumulator if k > 1 else 0",
        "new": "accum_bytes = 0",
        "tests": ["tests/test_mesh_accounting.py"],
    },
    {
        "name": "tensor-one-all-reduce-per-layer",
        "what": "inventory: one tensor all-reduce per layer forward, not two",
        "file": "src/tierax/tracing/inventory.py",
        "old": 'out.append(("tensor", 2 * 2 * (t - 1) / t * tokens * cfg.d_model * item))',
        "new": 'out.append(("tensor", 2 * (t - 1) / t * tokens * cfg.d_model * item))',
        "tests": ["tests/test_mesh_accounting.py"],
    },
    {
        "name": "data-all-reduce-ring-factor-halved",
        "what": "the data all-reduce sends (n-1)/n of the gradient, not 2(n-1)/n",
        "file": "src/tierax/costmodel/fixed.py",
        "old": 'out["data"] = 2 * inv.grad_bytes *',
        "new": 'out["data"] = inv.grad_bytes *',
        "tests": ["tests/test_collective_terms.py"],
    },
    {
        "name": "data-priced-at-the-fsdp-link",
        "what": "the data all-reduce priced at the FSDP group's link",
        "file": "src/tierax/costmodel/fixed.py",
        "old": '/ n_data / links["data"].bytes_per_s',
        "new": "/ n_data / links[network.FSDP_GROUP].bytes_per_s",
        "tests": ["tests/test_collective_terms.py"],
    },
    {
        "name": "domain-spread-smallest-divisor",
        "what": "devices_per_domain: the smallest even spread, not the fullest",
        "file": "src/tierax/costmodel/network.py",
        "old": "return even[0] if even else domain",
        "new": "return even[-1] if even else domain",
        "tests": ["tests/test_collective_terms.py"],
    },
    {
        "name": "domain-spread-excludes-half",
        "what": "devices_per_domain: half a domain no longer an even spread",
        "file": "src/tierax/costmodel/network.py",
        "old": "range(domain, (domain + 1) // 2 - 1, -1)",
        "new": "range(domain, (domain + 1) // 2, -1)",
        "tests": ["tests/test_collective_terms.py"],
    },
    {
        "name": "first-touch-threshold-exclusive",
        "what": "first touch counted at exactly the mmap threshold",
        "file": "src/tierax/costmodel/first_touch.py",
        "old": "fresh <= MMAP_THRESHOLD_MAX_BYTES",
        "new": "fresh < MMAP_THRESHOLD_MAX_BYTES",
        "tests": ["tests/test_cpu_terms.py"],
    },
    {
        "name": "first-touch-counts-optimizer-state",
        "what": "first touch counts the donated optimizer state as fresh",
        "file": "src/tierax/costmodel/first_touch.py",
        "old": "max(0.0, peak_bytes - inv.param_bytes - inv.optimizer_bytes)",
        "new": "max(0.0, peak_bytes - inv.param_bytes)",
        "tests": ["tests/test_cpu_terms.py"],
    },
    {
        "name": "transposes-offload-not-kept",
        "what": "transposing term: an offloaded name under a remat policy counted as recomputed "
        "(XLA:CPU keeps it in the stacks)",
        "file": "src/tierax/costmodel/transposes.py",
        "old": "if mine.get(n) is not plan_lib.Placement.REMAT",
        "new": "if mine.get(n) is plan_lib.Placement.DEVICE",
        "tests": ["tests/test_cpu_terms.py"],
    },
    {
        "name": "transposes-one-layer-stacked",
        "what": "transposing term: a one-layer group's residuals read from stacks",
        "file": "src/tierax/costmodel/transposes.py",
        "old": "stacks = 1.0 if layers > 1 else 0.0",
        "new": "stacks = 1.0",
        "tests": ["tests/test_cpu_terms.py"],
    },
    {
        "name": "transposes-aliased-at-spread-rate",
        "what": "transposing term: aliased rows at the spread rows' rate",
        "file": "src/tierax/costmodel/transposes.py",
        "old": "aliased_rate = rates.transpose_aliased_read_elems_per_s or rate",
        "new": "aliased_rate = rate",
        "tests": ["tests/test_cpu_terms.py"],
    },
    {
        "name": "vocab-check-off-by-one",
        "what": "check_vocab admits an id equal to vocab_size",
        "file": "src/tierax/train/data/streams.py",
        "old": "if corpus.vocab_size <= vocab_size:",
        "new": "if corpus.vocab_size <= vocab_size + 1:",
        "tests": ["tests/test_data_edges.py"],
    },
    {
        "name": "token-dtype-uint8-limit",
        "what": "token_dtype: a 256-id vocabulary gets uint16",
        "file": "src/tierax/train/data/tokenizer.py",
        "old": "if vocab_size <= 1 << 8:",
        "new": "if vocab_size < 1 << 8:",
        "tests": ["tests/test_data_edges.py"],
    },
    {
        "name": "sequence-numbers-ignore-accum",
        "what": "sequence_numbers: microsteps of consecutive steps overlap",
        "file": "src/tierax/train/data/loader.py",
        "old": "((step - 1) * a + np.arange(a)[:, None]) * b",
        "new": "((step - 1) + np.arange(a)[:, None]) * b",
        "tests": ["tests/test_data_edges.py"],
    },
    {
        "name": "mixture-deal-no-offset",
        "what": "the mixture's per-corpus sequence number keeps the block offset of the label",
        "file": "src/tierax/train/data/loader.py",
        "old": "return d, block * self.counts[d] + (label - self._cum[d])",
        "new": "return d, block * self.counts[d] + label",
        "tests": ["tests/test_data_edges.py"],
    },
    {
        "name": "document-limit-off-by-one",
        "what": "a text document exactly at the size limit refused",
        "file": "src/tierax/train/data/documents.py",
        "old": "        if len(raw) > limit:  # the whole document's size",
        "new": "        if len(raw) >= limit:  # the whole document's size",
        "tests": ["tests/test_data_edges.py"],
    },
    {
        "name": "prepared-checksum-skipped",
        "what": "open_prepared checks checksums only without verify",
        "file": "src/tierax/train/data/prepared.py",
        "old": "if verify and sha256 is not None and sha256_file(path) != sha256:",
        "new": "if not verify and sha256 is not None and sha256_file(path) != sha256:",
        "tests": ["tests/test_data_edges.py"],
    },
    {
        "name": "hf-vocab-without-added-tokens",
        "what": "a Hugging Face tokenizer's vocabulary leaves out its added tokens",
        "file": "src/tierax/train/data/tokenizer.py",
        "old": "self.tok.get_vocab_size(with_added_tokens=True),",
        "new": "self.tok.get_vocab_size(with_added_tokens=False),",
        "tests": ["tests/test_data_edges.py"],
    },
    # Issue 60's survivors of an outside audit (each run against the test file written for it).
    {
        "name": "mesh-sensitivity-rate-unit-slip",
        "what": "mesh_search.sensitivity: a row's rate in MB/s read as GB/s (1000x)",
        "file": "src/tierax/solving/mesh_search.py",
        "old": "gbps = getattr(rates, RATE_FIELDS[key]) * factor / 1e9",
        "new": "gbps = getattr(rates, RATE_FIELDS[key]) * factor / 1e6",
        "tests": ["tests/test_audit_gaps_mesh_search.py"],
    },
    # Issue 60's time-bound fixture (tests/test_mesh_search_bound.py: the best and the N-th best
    # differ there, so a pruning rule against the wrong one changes the top N or what is pruned).
    {
        "name": "mesh-time-bound-against-the-best",
        "what": "mesh_search: a candidate pruned when its bound is no faster than the best solved "
        "step, not the N-th best",
        "file": "src/tierax/solving/mesh_search.py",
        "old": "c.lower_bound_s >= sorted(times)[top - 1]:",
        "new": "c.lower_bound_s >= sorted(times)[0]:",
        "tests": ["tests/test_mesh_search_bound.py", "tests/test_mesh_search.py"],
    },
    {
        "name": "mesh-time-bound-n-minus-one",
        "what": "mesh_search: pruning against the (N-1)-th best (N off by one, prunes early)",
        "file": "src/tierax/solving/mesh_search.py",
        "old": "len(times) >= top and c.lower_bound_s >= sorted(times)[top - 1]:",
        "new": "len(times) >= top - 1 and c.lower_bound_s >= sorted(times)[top - 2]:",
        "tests": ["tests/test_mesh_search_bound.py", "tests/test_mesh_search.py"],
    },
    {
        "name": "mesh-time-bound-n-plus-one",
        "what": "mesh_search: pruning against the (N+1)-th best (N off by one, prunes late)",
        "file": "src/tierax/solving/mesh_search.py",
        "old": "len(times) >= top and c.lower_bound_s >= sorted(times)[top - 1]:",
        "new": "len(times) >= top + 1 and c.lower_bound_s >= sorted(times)[top]:",
        "tests": ["tests/test_mesh_search_bound.py", "tests/test_mesh_search.py"],
    },
    {
        "name": "mesh-time-bound-every-collective",
        "what": "mesh_search: the time bound counts every collective second, hidden ones too (no "
        "longer under every placement's step)",
        "file": "src/tierax/solving/mesh_search.py",
        "old": "lower_bound_s=k * (fx.compute_s + fx.exposed_collective_s) - (k - 1) * update_s,",
        "new": "lower_bound_s=k * (fx.compute_s + fx.collective_s) - (k - 1) * update_s,",
        "tests": ["tests/test_mesh_search_bound.py", "tests/test_mesh_search.py"],
    },
    # Issue 60: moe_impl=ragged for the Mixtral family (tests/test_mixtral.py).
    {
        "name": "mixtral-ragged-runs-the-capacity-form",
        "what": "routed_experts runs the grouped GEMMs for the DeepSeek family only (Mixtral's "
        "ragged config silently runs the capacity form)",
        "file": "src/tierax/models/moe.py",
        "old": '    if getattr(cfg, "moe_impl", "capacity") == "ragged":\n'
        "        return _ragged_experts(",
        "new": '    if cfg.family == "deepseek" and getattr(cfg, "moe_impl", "capacity") == '
        '"ragged":\n        return _ragged_experts(',
        "tests": ["tests/test_mixtral.py"],
    },
    {
        "name": "ragged-combine-first-gate-for-every-choice",
        "what": "the ragged combine weights every choice by the first choice's gate",
        "file": "src/tierax/models/moe.py",
        "old": "term = y_GD * gates_Gk[:, j : j + 1].astype(y_GD.dtype)",
        "new": "term = y_GD * gates_Gk[:, 0:1].astype(y_GD.dtype)",
        "tests": ["tests/test_mixtral.py"],
    },
    {
        "name": "llama-moe-impl-unchecked",
        "what": "a Llama-family config takes any moe_impl (megablox, mxfp8 with ragged) unchecked",
        "file": "src/tierax/models/config.py",
        "old": "        _check_moe_impl(self)\n        _check(\n"
        '            self.moe_impl == "capacity" or',
        "new": '        _check(\n            self.moe_impl == "capacity" or',
        "tests": ["tests/test_mixtral.py"],
    },
    {
        "name": "mesh-candidates-solved-in-mesh-order",
        "what": "mesh_search: candidates solved in the order of their mesh's text, not their bound",
        "file": "src/tierax/solving/mesh_search.py",
        "old": "key=lambda c: (c.lower_bound_s, str(c.mesh))",
        "new": "key=lambda c: str(c.mesh)",
        "tests": ["tests/test_mesh_search_bound.py", "tests/test_mesh_search.py"],
    },
    {
        "name": "cudnn-workspace-heads-not-split-over-tensor",
        "what": "the cuDNN backward workspace counts every head on each tensor shard",
        "file": "src/tierax/tracing/model_program.py",
        "old": 'FusedAttention(cfg.attention, cfg.num_heads // inv.mesh.get("tensor", 1), dqk)',
        "new": 'FusedAttention(cfg.attention, cfg.num_heads, dqk)',
        "tests": ["tests/test_audit_gaps_costmodel.py"],
    },
    {
        "name": "transposes-no-remat-from-the-names",
        "what": "transposing term: no remat read from the names kept, not the unnamed placement",
        "file": "src/tierax/costmodel/transposes.py",
        "old": "if kept is plan_lib.Placement.DEVICE:",
        "new": "if all(p is not plan_lib.Placement.REMAT for p in mine.values()):",
        "tests": ["tests/test_audit_gaps_costmodel.py"],
    },
    {
        "name": "transposes-layer-input-counted-twice",
        "what": "transposing term: the named layer input's reads counted as carry and as a name",
        "file": "src/tierax/costmodel/transposes.py",
        "old": "carry = named.pop(N.DECODER_LAYER_INPUT, 0.0)",
        "new": "carry = named.get(N.DECODER_LAYER_INPUT, 0.0)",
        "tests": ["tests/test_audit_gaps_costmodel.py"],
    },
    {
        "name": "transposed-reads-carry-also-named",
        "what": "hbm.transposed_reads: the tagged layer input's reads go to its name as well",
        "file": "src/tierax/tracing/hbm.py",
        "old": '                out["carry"] += share\n            elif v in names:',
        "new": '                out["carry"] += share\n            if v in names:',
        "tests": ["tests/test_audit_gaps_costmodel.py"],
    },
    {
        "name": "host-peak-accumulator-once",
        "what": "state.host_peak: the offloaded accumulator once on the host while added to",
        "file": "src/tierax/costmodel/state.py",
        "old": "    held = max(activation_host_bytes + accum_host_bytes, 2 * accum_host_bytes)\n",
        "new": "    held = max(activation_host_bytes + accum_host_bytes, accum_host_bytes)\n",
        "tests": ["tests/test_audit_gaps_costmodel.py"],
    },
    {
        "name": "exposed-collectives-once-per-step",
        "what": "costmodel.evaluate: exposed collectives counted once per step, not per microbatch",
        "file": "src/tierax/costmodel/predict.py",
        "old": "    exposed = exposed_d2h + exposed_h2d + exposed_coll\n",
        "new": "    exposed = exposed_d2h + exposed_h2d\n"
        "    first_touch = first_touch + exposed_coll\n",
        "tests": ["tests/test_audit_gaps_costmodel.py"],
    },
    {
        "name": "splash-mesh-drops-segment-ids",
        "what": "splash attention on a mesh runs without the segment ids (documents leak)",
        "file": "src/tierax/models/attention.py",
        "old": "    if segment_ids is not None:\n        args, specs = (*args, segment_ids)",
        "new": "    if False:\n        args, specs = (*args, segment_ids)",
        "tests": ["tests/test_audit_gaps_splash_mesh.py"],
    },
    {
        "name": "prepared-document-ends-unchecked",
        "what": "open_prepared: document ends that miss the token count are not refused",
        "file": "src/tierax/train/data/prepared.py",
        "old": 'len(doc_ends) and doc_ends[-1] != s["num_tokens"]',
        "new": "False",
        "tests": ["tests/test_audit_gaps_data.py"],
    },
    {
        "name": "tiktoken-vocab-without-specials",
        "what": "a tiktoken file's vocabulary leaves out its 256 special tokens",
        "file": "src/tierax/train/data/tokenizer.py",
        "old": "            n + LLAMA3_SPECIALS,\n",
        "new": "            n,\n",
        "tests": ["tests/test_audit_gaps_data.py"],
    },
    {
        "name": "max-microbatch-check-keeps-the-first-refusal",
        "what": "plan --max-microbatch --check bounds by its first refusal, not the smallest",
        "file": "src/tierax/solving/plan_check.py",
        "old": "fail_mb = mb if fail_mb is None else min(fail_mb, mb)",
        "new": "fail_mb = mb if fail_mb is None else fail_mb",
        "tests": ["tests/test_audit_gaps_plan_check.py"],
    },
    {
        "name": "calibrate-memory-rate-from-the-stream",
        "what": "calibrate stores the streaming-copy rate as the non-matmul memory rate",
        "file": "src/tierax/measure/calibrate.py",
        "old": '    entry["memory_bytes_per_s"] = nm["bytes_per_s"]\n',
        "new": '    entry["memory_bytes_per_s"] = mem["memory_bytes_per_s"]\n',
        "tests": ["tests/test_audit_gaps_calibrate.py"],
    },
    {
        "name": "calibrate-aliased-transpose-rate-from-spread",
        "what": "calibrate stores the spread transposing-fusion rate as the row-aliased one",
        "file": "src/tierax/measure/calibrate.py",
        "old": '= tr["aliased"]["elems_per_s"]\n',
        "new": '= tr["spread"]["elems_per_s"]\n',
        "tests": ["tests/test_audit_gaps_calibrate.py"],
    },
]


def _checkout(commit: str, dest: pathlib.Path) -> None:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "src", "tests", "data", "pyproject.toml"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def _run_tests(copy: pathlib.Path, files: list[str], tag: str) -> dict:
    """{test id: passed?} for ``files`` run in ``copy``."""
    xml = copy / f"junit-{tag}.xml"
    env = dict(os.environ, PYTHONPATH=str(copy / "src"), JAX_PLATFORMS="cpu")
    t0 = time.perf_counter()
    proc = _common.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={xml}",
            *files,
        ],
        cwd=copy,
        env=env,
    )
    outcomes = {}
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            tid = f"{case.get('classname')}::{case.get('name')}"
            bad = any(child.tag in ("failure", "error") for child in case)
            skipped = any(child.tag == "skipped" for child in case)
            if not skipped:
                outcomes[tid] = not bad
    return {
        "outcomes": outcomes,
        "seconds": round(time.perf_counter() - t0, 1),
        "returncode": proc.returncode,
        "tail": proc.stdout[-1500:] if not outcomes else "",
    }


def _imports_from(copy: pathlib.Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(copy / "src"))
    return subprocess.run(
        [sys.executable, "-c", "import tierax; print(tierax.__file__)"],
        env=env,
        cwd=copy,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", default="HEAD", help="the commit to copy and mutate (default HEAD)")
    ap.add_argument("--only", nargs="*", help="mutation names to run (default: all)")
    _common.add_out(ap, "mutations.json")
    args = ap.parse_args()

    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", args.commit],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    chosen = [m for m in MUTATIONS if not args.only or m["name"] in args.only]
    record = _common.envelope("tierax.mutations/1") | {
        "commit": commit,
        "rule": "caught = some test that passes on the unpatched copy fails on the patched copy",
        "mutations": [],
    }
    with tempfile.TemporaryDirectory(prefix="tierax-mutations-") as tmp:
        tmp = pathlib.Path(tmp)
        base = tmp / "base"
        base.mkdir()
        _checkout(commit, base)
        where = _imports_from(base)
        if not where.startswith(str(base)):
            raise SystemExit(f"the copy's tests would import tierax from {where}, not the copy")
        baseline = {}
        for f in sorted({f for m in chosen for f in m["tests"]}):
            print(f"baseline {f} ...", flush=True)
            baseline[f] = _run_tests(base, [f], "base-" + pathlib.Path(f).stem)
            print(
                f"  {sum(baseline[f]['outcomes'].values())}/{len(baseline[f]['outcomes'])} pass "
                f"({baseline[f]['seconds']} s)",
                flush=True,
            )
        for m in chosen:
            copy = tmp / m["name"]
            copy.mkdir()
            _checkout(commit, copy)
            target = copy / m["file"]
            text = target.read_text()
            if text.count(m["old"]) != 1:
                raise SystemExit(
                    f"{m['name']}: the code to break is not (uniquely) in {m['file']} at "
                    f"{commit[:10]}; "
                    "update MUTATIONS"
                )
            target.write_text(text.replace(m["old"], m["new"]))
            entry = {k: m[k] for k in ("name", "what", "file", "tests")}
            entry["caught_by"], entry["already_failing"], entry["seconds"] = [], [], 0.0
            for f in m["tests"]:
                print(f"{m['name']}: {f} ...", flush=True)
                run = _run_tests(copy, [f], pathlib.Path(f).stem)
                entry["seconds"] += run["seconds"]
                base_out = baseline[f]["outcomes"]
                entry["already_failing"] += [t for t, ok in base_out.items() if not ok]
                entry["caught_by"] += [
                    t for t, ok in run["outcomes"].items() if not ok and base_out.get(t)
                ]
                if not run["outcomes"]:
                    entry.setdefault("errors", []).append(run["tail"])
            entry["caught"] = bool(entry["caught_by"])
            entry["seconds"] = round(entry["seconds"], 1)
            print(
                f"  {'CAUGHT' if entry['caught'] else 'MISSED'} by {len(entry['caught_by'])} tests",
                flush=True,
            )
            record["mutations"].append(entry)
    record["baseline"] = {
        f: {
            "passed": sum(b["outcomes"].values()),
            "tests": len(b["outcomes"]),
            "seconds": b["seconds"],
        }
        for f, b in baseline.items()
    }
    record["all_caught"] = all(m["caught"] for m in record["mutations"])
    out = _common.write_record(args.out, record)
    for m in record["mutations"]:
        print(f"{'CAUGHT' if m['caught'] else 'MISSED'}  {m['name']}: {len(m['caught_by'])} tests")
    print(f"wrote {out}")
    return 0 if record["all_caught"] else 1


if __name__ == "__main__":
    sys.exit(main())
