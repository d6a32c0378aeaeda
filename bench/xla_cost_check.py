#!/usr/bin/env python3
"""XLA's own cost analysis of tierax's train step beside the cost model, per layer, for published
runs the cost model predicts too fast.

For each chosen row of ``bench/data/published_runs.yaml`` (expressed as ``bench/published_runs.py``
expresses it: model, mesh, MaxText remat keys as a plan, precision, attention, per-device batch and
sequence) tierax's step is compiled deviceless (``tierax.xla.compile.compile_for_target``, the
``tierax compile`` path) at reduced depth, in sets of three compiles (each in a child process):
(layers, layers per scan trip) = (2, 1), (4, 1), (4, 2) on XLA:GPU; on XLA:TPU (4, 1), (8, 1),
(8, 2) with XLA's collective matmul for all-gathers off and the row's offloaded names kept on
device, and its default program at (2, 1), (4, 1) beside them, not separated (:data:`ROWS` says
why).
``scan_unroll`` sets the layers per trip: the same computation.

XLA's ``cost_analysis()`` counts a loop body once whatever its trip count (the record's
``loop_probe``: a scanned matmul compiled at 2 and 4 layers gives the same FLOPs), and XLA:TPU
inlines a layer loop of 2 trips.  So a compile's figure is ``rest + layers·outside + counted·body``
(``counted``: the layers of one trip where the layer loops stayed loops, every layer where XLA
inlined them, read from its HLO) and three compiles give, by :func:`solve`, the layer loop's body
(one layer's forward and backward, its recomputation included), the work outside the loops that
grows with depth (the update of the stacked weights, their casts), a layer (the two together) and
the depth-independent rest (embedding, head, loss, the other parameters' update).

The scheduled HLO of each compile is also read (trip counts multiplied in): every instruction's HBM
bytes by class — matmul fusions (a ``dot`` or ``convolution`` inside), attention kernels (cuDNN's
and the Pallas ``tpu_custom_call``), collectives, asynchronous copies, and the rest (XLA's
non-matmul fusions, copies, slices: what ``tierax.tracing.hbm`` models), with the same in-place and
sliced-access rules as ``bench/hbm_time.py``; and the largest non-matmul instructions with their
op names; XLA:TPU's HLO states no trip count for a layer loop, whose trips are then layers / layers
per trip.  Its per layer is the difference of the set's two depths at one layer per trip.

The cost model's figures are for the same reduced config and mesh (``simulate``, schedule ``lhs``,
as ``bench/published_runs.py``): executed FLOPs outside and inside fused attention kernels
(forward, backward, recomputation), non-matmul HBM bytes (``hbm_s`` and ``recompute_hbm_s`` × the
HBM rate; their parts as ``bench/hbm_time.py`` lists them), and the time terms; per layer from the
set's two depths.  A deviceless XLA:GPU executable has no ``cost_analysis()`` (None): there the
reader's count of XLA's dots and cuBLAS GEMMs, every trip, stands for XLA's FLOPs.

XLA counts no FLOPs, and XLA:TPU no seconds, inside a custom call (the
record's ``sentinel_probe``: splash attention alone), so XLA's FLOPs compare with the model's
FLOPs outside fused kernels, and ``optimal_seconds`` with the model's time outside them.
XLA:TPU's ``optimal_seconds`` adds −1 for each ``ConcatBitcast`` custom call (the probe: its
programs with 0 or 1 such call); the record keeps the raw figure, the count and the corrected one.

Nothing is fitted or changed: this is a trace.  No TPU or GPU runs here.

    .venv/bin/python bench/xla_cost_check.py                 # → bench/results/xla_cost_check.json
    .venv/bin/python bench/xla_cost_check.py --rows TR-3 --out /tmp/tr3.json
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import subprocess
import sys

import _common
import hbm_time
import published_runs as pr

# Row → the mesh compiled (the row's own where a compile of it finishes in minutes here).
# Row → the mesh compiled (the row's own: a compile of it finishes in minutes here) and the sets of
# compiles, each (num_layers, scan_unroll) × 3 whose figures :func:`solve` separates.  XLA:TPU's
# default program all-gathers through collective-matmul loops whose trip counts its HLO does not
# state and whose bodies cost_analysis counts once, and it refuses host-offloaded stacks of a scan
# of 2 layers per trip: the set that is solved there turns the collective matmul off and keeps the
# offloaded names on device (the same FLOPs and non-matmul work; no host copies), at 4 and 8 layers
# (a 2-trip layer loop is inlined by XLA:TPU, where its CSE could merge a recomputation with its
# forward).
GPU_SETS = (dict(name="default flags", variants=((2, 1), (4, 1), (4, 2))),)
ROWS: dict[str, dict] = {
    "TR-3": dict(
        mesh="fsdp=32",
        sets=(
            dict(name="default flags (not separable)", variants=((2, 1), (4, 1)), solve=False),
            dict(
                name="collective matmul off, offloaded names on device",
                variants=((4, 1), (8, 1), (8, 2)),
                windowed=False,
                on_device=True,
            ),
        ),
    ),
    "G-4": dict(mesh="fsdp=128", sets=GPU_SETS),
    "G-2": dict(mesh="fsdp=64", sets=GPU_SETS),
}
TIMEOUT_S = 1500
ATTENTION_CALLS = ("tpu_custom_call", "__cudnn$fmha")
SENTINEL_CALL = "ConcatBitcast"
# A layer group's scan, forward or backward, as XLA names its while loop
LAYER_LOOP = re.compile(r"tierax_group_\w+\)+/while$")
# XLA:TPU's collective matmul (on by default): an all-gathered matmul becomes a loop over the
# shards, whose body cost_analysis counts once; off, the gather and the matmul are counted whole
NO_WINDOWED = "--xla_tpu_enable_windowed_einsum_for_all_gather=false"
TOP = 25


def solve(points: list[tuple[int, int, float]]) -> dict:
    """XLA's figure for three compiles ``(layers, layers counted, figure)`` → the per-layer work
    outside the layer loop, the loop body (one layer), a layer, and the depth-independent rest.

    A compile counts its work outside loops once, each layer's share of the outside work (the
    update of the stacked weights) once per layer, and the layer loop's body once per layer it
    holds (``layers counted``: the layers per trip, or every layer where XLA inlined the loop):
    ``figure = rest + layers·outside + counted·body``.

    Raises:
      ValueError: the three compiles do not separate the three parts (e.g. two alike).
    """
    import numpy as np

    a = np.array([[1.0, n, k] for n, k, _ in points])
    if len(points) != 3 or abs(np.linalg.det(a)) < 1e-9:
        raise ValueError(f"compiles {[(n, k) for n, k, _ in points]} do not separate the parts")
    rest, outside, body = np.linalg.solve(a, np.array([c for *_, c in points]))
    return {
        "body": float(body),
        "outside_per_layer": float(outside),
        "per_layer": float(body + outside),
        "fixed": float(rest),
    }


def per_layer(ma: float, mb: float, la: int = 2, lb: int = 4) -> dict:
    """A figure counted over every layer at ``la`` and ``lb`` layers → per layer and the rest."""
    layer = (mb - ma) / (lb - la)
    return {"per_layer": layer, "fixed": ma - la * layer}


# --- the child: one compile ----------------------------------------------------------------------


def _classify(module, ins) -> str:
    op = ins.opcode
    if op.startswith(hbm_time.COLLECTIVE):
        return "collective"
    if op.endswith(("-start", "-done", "-update")):
        return "async copy"
    if op == "custom-call":
        if any(c in ins.attrs for c in ATTENTION_CALLS):
            return "attention kernel"
        if "gemm" in ins.attrs or "cublas" in ins.attrs:
            return "matmul"
    if op in ("dot", "convolution"):
        return "matmul"
    if op == "fusion":
        called = module.computations.get(ins.attr("calls") or "", [])
        stack, seen = list(called), set()
        while stack:
            i = stack.pop()
            if i.opcode in ("dot", "convolution"):
                return "matmul"
            sub = i.attr("calls")
            if sub and sub not in seen and sub in module.computations:
                seen.add(sub)
                stack += module.computations[sub]
    return "non-matmul"


_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _executions(module, trips: dict[str, int]) -> dict[str, int]:
    """Computation → executions per step, ``trips`` of each loop body multiplied in."""
    return module.executions(trips)


def hlo_bytes(text: str, layer_trips: int | None = None) -> dict:
    """HBM bytes of a scheduled module by instruction class, trip counts multiplied in (and, to
    compare with XLA's body-once count, not), and the largest non-matmul instructions;
    ``layer_trips``: the trips of a layer loop whose trip count the HLO does not state."""
    from tierax.xla import hlo

    module = hlo.parse_module(text)
    pnum = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"%([\w.\-]+) = [^\n]*? parameter\((\d+)\)", text)
    }
    # The layer loops: XLA:GPU names each (op_name "…tierax_group_decoder)/while") and states its
    # trip count; XLA:TPU's carry no op_name (their body's instructions do) and no trip count, so
    # theirs is ``layer_trips``.  A collective-matmul loop (op_name "…/dot_general") is none.
    trips = module.trip_counts()
    loops = []
    for instrs in module.computations.values():
        for ins in instrs:
            if ins.opcode != "while":
                continue
            m = re.search(r'op_name="([^"]*)"', ins.attrs)
            body = ins.attr("body") or ""
            inner = " ".join(i.attrs for i in module.computations.get(body, []))
            if (m and LAYER_LOOP.search(m.group(1))) or (not m and "tierax_group_" in inner):
                t = _TRIP.search(ins.attrs)
                if t is None and layer_trips:
                    trips[body] = layer_trips
                loops.append(
                    {
                        "op_name": m.group(1) if m else "",
                        "body": body,
                        "known_trip_count": int(t.group(1)) if t else None,
                        "trips_used": trips.get(body),
                    }
                )
    execs = _executions(module, trips)
    scheduled, frontier = {module.entry}, [module.entry]
    while frontier:
        c = frontier.pop()
        for ins in module.computations.get(c, []):
            kids = [ins.attr(k) for k in ("body", "condition", "to_apply")]
            if ins.opcode == "conditional":
                m = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
                kids += re.findall(r"%?([\w.\-]+)", m.group(1)) if m else []
                kids += [ins.attr("true_computation"), ins.attr("false_computation")]
            if ins.opcode not in ("while", "call", "conditional"):
                continue
            for child in kids:
                if child and child not in scheduled:
                    scheduled.add(child)
                    frontier.append(child)
    weighted: dict[str, float] = collections.defaultdict(float)
    once: dict[str, float] = collections.defaultdict(float)
    whole_once = 0.0  # every operand and output whole, body once (XLA's own counting is close)
    gemm_flops = 0.0
    rows = []
    calls = collections.Counter()
    for c in scheduled:
        n = execs.get(c, 1)
        for ins in module.computations[c]:
            op = ins.opcode
            if op == "custom-call":
                m = re.search(r'custom_call_target="([^"]*)"', ins.attrs)
                calls[m.group(1) if m else "?"] += 1
            if op in hbm_time.SKIP or op.endswith("-done"):
                continue
            kind = _classify(module, ins)
            r, w = hbm_time.io_bytes(module, ins, pnum)
            weighted[kind] += n * (r + w)
            once[kind] += r + w
            whole_once += module.operand_bytes(ins) + ins.out_bytes
            gemm_flops += n * module.instruction_flops(ins)
            if kind == "non-matmul":
                m = re.search(r'op_name="([^"]*)"', ins.attrs)
                rows.append(
                    (n * (r + w), n, op, ins.name, ins.type_text[:80], m.group(1) if m else "")
                )
    rows.sort(reverse=True)
    return {
        "layer_loops": loops,
        "bytes_by_class": dict(weighted),
        "bytes_by_class_body_once": dict(once),
        "bytes_whole_operands_body_once": whole_once,
        # dots and cuBLAS GEMMs only: XLA:TPU's convolutions are not counted here
        "dot_flops": gemm_flops,
        "custom_calls": dict(calls),
        "top_non_matmul": [
            {"bytes": b, "executions": n, "opcode": op, "name": nm, "type": t, "op_name": on}
            for b, n, op, nm, t, on in rows[:TOP]
        ],
    }


def _row_config(row: str, layers: int, unroll: int, on_device: bool = False):
    """The row's run and expression at ``layers`` layers, ``unroll`` per scan trip; ``on_device``:
    its offloaded names kept on device instead (XLA:TPU refuses host-offloaded stacks of a scan of
    more than one layer per trip: "Async slice only supports slicing in 1 dimension")."""
    data = pr.load_data(pr.DATA)
    run = next(r for r in data["runs"] if r["id"] == row)
    spec = dict(pr.EXPRESS[row])
    spec["set"] = [*spec.get("set", []), f"num_layers={layers}", f"scan_unroll={unroll}"]
    if on_device:
        spec["remat"] = {k: "device" if v == "offload" else v for k, v in spec["remat"].items()}
    return run, spec


def compile_one(
    row: str,
    layers: int,
    unroll: int,
    mesh_text: str,
    hlo_out: str | None,
    windowed: bool = True,
    on_device: bool = False,
) -> dict:
    """Compile one variant (JAX started here: a child process per compile); ``windowed``: XLA:TPU's
    collective matmul for all-gathers as by default (False: off, :data:`NO_WINDOWED`)."""
    import os
    import time

    from tierax import hardware, launch
    from tierax.mesh import parse_mesh

    run, spec = _row_config(row, layers, unroll, on_device)
    tpu = hardware.platform(run["hw"]) != "gpu"
    shape = parse_mesh(mesh_text, None)
    if tpu and not windowed:
        os.environ["LIBTPU_INIT_ARGS"] = f"{os.environ.get('LIBTPU_INIT_ARGS', '')} {NO_WINDOWED}"
    if tpu:
        launch.start_deviceless_tpu(
            "none", hardware.compile_target(run["hw"]).accelerator_type(shape.size)
        )
    else:
        launch.start(preset="none", deviceless_gpu=True)
    from tierax.xla import compile as C

    cfg = pr._config(spec, spec.get("attention", "auto"))
    plan = pr._plan(spec["remat"], cfg, "tpu" if tpu else "gpu", row)
    got: dict = {}
    t0 = time.perf_counter()
    res, text = C.compile_for_target(
        cfg,
        plan,
        run["hw"],
        microbatch=run["batch"],
        seq=run["seq"],
        mesh=shape,
        on_compiled=lambda c: got.update(ca=c.cost_analysis()),
    )
    wall = time.perf_counter() - t0
    if "ca" not in got:
        raise SystemExit(
            f"{row} L={layers} unroll={unroll}: XLA refused the program (out of memory)"
        )
    ca = got["ca"][0] if isinstance(got["ca"], list) else got["ca"]
    available = ca is not None  # a deviceless XLA:GPU executable answers None
    ca = ca or {}
    if hlo_out:
        pathlib.Path(hlo_out).write_text(text)
    reader = hlo_bytes(text, layers // unroll)
    sentinels = reader["custom_calls"].get(SENTINEL_CALL, 0)
    os_raw = ca.get("optimal_seconds")
    return {
        "row": row,
        "num_layers": layers,
        "scan_unroll": unroll,
        "windowed_einsum_all_gather": windowed if tpu else None,
        "offloaded_names_on_device": on_device,
        # layers cost_analysis counts of the layer loop's body: those of one trip where the loop
        # stayed a loop (forward and backward), every layer where XLA inlined it
        "layers_counted": {0: layers, 1: None}.get(len(reader["layer_loops"]), unroll),
        "mesh": shape.to_dict(),
        "compile_wall_s": wall,
        "cost_analysis": {
            "available": available,
            "flops": ca.get("flops"),
            "bytes_accessed": ca.get("bytes accessed"),
            "transcendentals": ca.get("transcendentals"),
            "optimal_seconds_raw": os_raw,
            "concat_bitcast_calls": sentinels,
            "optimal_seconds": None if os_raw is None else os_raw + sentinels,
            "keys": sorted(ca),
        },
        "hlo": reader,
        "compile": {
            "device_peak_bytes": res.device_peak_bytes,
            "fits": res.fits,
            "host_temp_bytes": res.host_temp_bytes,
            "tpu_custom_calls": res.tpu_custom_calls,
            "cudnn_calls": res.cudnn_calls,
            "libtpu_version": res.libtpu_version,
        },
    }


# --- probes (small, in a child each) -------------------------------------------------------------


def probes() -> dict:
    """XLA:TPU's counting on small programs: a scanned matmul at 2 and 4 layers (loop bodies
    counted once?) and splash attention alone (FLOPs and seconds inside the kernel? the
    ``optimal_seconds`` sentinel)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from tierax import hardware, launch

    launch.start_deviceless_tpu("none", hardware.compile_target("v6e").accelerator_type(1))
    from tierax.models.attention import causal_attention
    from tierax.xla import compile as C

    s = SingleDeviceSharding(C.tpu_topology(hardware.get_target("v6e"), 1).devices[0])

    def cost(c) -> dict:
        ca = c.cost_analysis()
        ca = ca[0] if isinstance(ca, list) else ca
        t = c.as_text()
        return {
            "flops": ca.get("flops"),
            "bytes_accessed": ca.get("bytes accessed"),
            "optimal_seconds_raw": ca.get("optimal_seconds"),
            "custom_calls": dict(
                collections.Counter(re.findall(r'custom_call_target="([^"]*)"', t))
            ),
        }

    def stack(x, w):
        return jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)[0].sum()

    loop = {}
    d = 1024
    for layers in (2, 4):
        x = jax.ShapeDtypeStruct((d, d), jnp.bfloat16, sharding=s)
        w = jax.ShapeDtypeStruct((layers, d, d), jnp.bfloat16, sharding=s)
        got = cost(jax.jit(jax.grad(stack, argnums=(0, 1))).trace(x, w).lower().compile())
        loop[str(layers)] = got | {"matmul_flops_all_layers": 3 * 2 * d**3 * layers}
    B, S, K, D = 1, 4096, 8, 128
    q = jax.ShapeDtypeStruct((B, S, K, 1, D), jnp.bfloat16, sharding=s)
    kv = jax.ShapeDtypeStruct((B, S, K, D), jnp.bfloat16, sharding=s)
    splash = {}
    for impl in ("splash", "splash_blockwise"):

        def loss(q, k, v, impl=impl):
            return causal_attention(q, k, v, impl=impl).astype(jnp.float32).sum()

        for grad in (False, True):
            fn = jax.grad(loss, argnums=(0, 1, 2)) if grad else loss
            c = jax.jit(fn).trace(q, kv, kv).lower().compile()
            splash[f"{impl}{' grad' if grad else ''}"] = cost(c)
    return {
        "loop_probe": loop,
        "sentinel_probe": {
            "shape": {"batch": B, "seq": S, "heads": K, "head_dim": D},
            "causal_forward_matmul_flops": 4 * B * S * S * K * D / 2,
            "programs": splash,
        },
    }


# --- the parent: model side and the record -------------------------------------------------------


def model_side(row: str, layers: int, mesh_text: str, on_device: bool = False) -> dict:
    from tierax import costmodel as cm
    from tierax import hardware
    from tierax import plan as plan_lib
    from tierax.costmodel.predict import keeps_unnamed, plan_placements
    from tierax.costmodel.rates import FUSED_BACKWARD_FLOPS_RATIO
    from tierax.mesh import parse_mesh
    from tierax.tracing import inventory as inv_lib
    from tierax.tracing.model_program import for_inventory

    run, spec = _row_config(row, layers, 1, on_device)
    cfg = pr._config(spec, spec.get("attention", "auto"))
    kind = "gpu" if hardware.platform(run["hw"]) == "gpu" else "tpu"
    plan = pr._plan(spec["remat"], cfg, kind, row)
    mesh = parse_mesh(mesh_text, None).to_dict()
    inv = inv_lib.for_plan(inv_lib.model_inventory(cfg, run["batch"], run["seq"], mesh), plan, cfg)
    rates = cm.target_rates(run["hw"], cfg.dtype)
    pred = cm.simulate(plan, for_inventory(cfg, inv), rates, pr.SCHEDULE)
    b = pred.breakdown
    placements = plan_placements(plan, cfg)
    P = plan_lib.Placement
    tokens = run["batch"] * run["seq"]
    head = 2.0 * tokens * cfg.d_model * cfg.vocab_size
    flops_out = 3.0 * head + (head if cfg.loss_tiles > 1 else 0.0)
    flops_in = 0.0
    for g in inv.groups:
        L, F, Fa = g.num_layers, g.forward_flops_per_layer, g.fused_attention_flops_per_layer
        flops_out += 3.0 * (F - Fa) * L
        flops_in += (1 + FUSED_BACKWARD_FLOPS_RATIO) * Fa * L
        names = [a.name for a in g.activations if a.name != "decoder_layer_input"]
        if keeps_unnamed(placements, g.name, names):
            continue
        rec, rec_in = g.base_recompute_flops_per_layer, g.base_recompute_fused_flops_per_layer
        for a in g.activations:
            if a.name in names and placements[(g.name, a.name)] is P.REMAT:
                rec += a.recompute_flops_per_layer
                rec_in += a.recompute_fused_flops_per_layer
        flops_out += (rec - rec_in) * L
        flops_in += rec_in * L
    parts = hbm_time.model_side(cfg, plan, run["batch"], run["seq"], mesh, rates)
    hb = rates.hbm_bytes_per_s
    return {
        "num_layers": layers,
        "executed_flops_outside_fused_kernels": flops_out,
        "executed_flops_in_fused_kernels": flops_in,
        "executed_flops_breakdown": b.executed_flops,
        "non_matmul_hbm_bytes": (b.hbm_s + b.recompute_hbm_s) * hb,
        "non_matmul_hbm_parts": {k: v for k, v in parts.items() if k not in ("seconds",)},
        "compute_s": b.compute_s,
        "recompute_s": b.recompute_s,
        "hbm_s": b.hbm_s,
        "recompute_hbm_s": b.recompute_hbm_s,
        "fused_attention_s": b.fused_attention_s,
        "matmul_s": b.compute_s - b.hbm_s - b.fused_attention_s,
        "compute_plus_recompute_s": b.compute_s + b.recompute_s,
        "predicted_step_s": pred.step_time_s,
        "peak_device_bytes": pred.peak_device_bytes,
        "rates": {
            "matmul_flops_per_s": rates.matmul_flops_per_s,
            "hbm_bytes_per_s": hb,
            "sources": {k: b.rates[k] for k in ("matmul", "hbm", "fused_attention")},
        },
    }


def compare(
    compiles: dict,
    ma: dict,
    mb: dict,
    full_layers: int,
    measured: float,
    predicted_full: float,
) -> dict:
    """XLA's per-layer and fixed figures beside the model's (``ma``, ``mb``: at the set's two
    depths)."""
    keys = list(compiles)
    la, lb = ma["num_layers"], mb["num_layers"]
    at = {(c["num_layers"], c["scan_unroll"]): c for c in compiles.values()}
    ra, rb = at[(la, 1)], at[(lb, 1)]

    def xs(path):
        points = []
        for k in keys:
            v = compiles[k]
            for p in path:
                v = v[p]
            counted = compiles[k]["layers_counted"]
            if counted is None:
                return {"unresolved": f"{k}: one layer loop only (forward or backward inlined)"}
            points.append((compiles[k]["num_layers"], counted, float(v)))
        return solve(points)

    xla: dict = {}
    gpu = not ra["cost_analysis"]["available"]
    if not gpu:
        xla["flops"] = xs(("cost_analysis", "flops"))
        xla["bytes_accessed"] = xs(("cost_analysis", "bytes_accessed"))
        xla["optimal_seconds"] = xs(("cost_analysis", "optimal_seconds"))
    else:
        # XLA:GPU's program: its dots and cuBLAS GEMMs counted by the reader, every trip
        xla["dot_flops_every_trip"] = per_layer(
            ra["hlo"]["dot_flops"], rb["hlo"]["dot_flops"], la, lb
        )
    classes = sorted({k for v in compiles.values() for k in v["hlo"]["bytes_by_class"]})
    reader = {
        k: per_layer(
            ra["hlo"]["bytes_by_class"].get(k, 0.0), rb["hlo"]["bytes_by_class"].get(k, 0.0), la, lb
        )
        for k in classes
    }
    names = (
        "executed_flops_outside_fused_kernels",
        "executed_flops_in_fused_kernels",
        "non_matmul_hbm_bytes",
        "compute_s",
        "recompute_s",
        "hbm_s",
        "recompute_hbm_s",
        "fused_attention_s",
        "matmul_s",
        "compute_plus_recompute_s",
    )
    model = {k: per_layer(ma[k], mb[k], la, lb) for k in names}
    model["non_matmul_hbm_parts"] = {
        k: per_layer(ma["non_matmul_hbm_parts"][k], mb["non_matmul_hbm_parts"][k], la, lb)
        for k in ma["non_matmul_hbm_parts"]
    }
    hb = ma["rates"]["hbm_bytes_per_s"]
    flops = xla["dot_flops_every_trip"] if gpu else xla["flops"]
    nm_x = reader.get("non-matmul", {"per_layer": 0.0, "fixed": 0.0})
    nm_m = model["non_matmul_hbm_bytes"]
    mf = model["executed_flops_outside_fused_kernels"]
    out = {
        "xla": xla,
        "hlo_reader": reader,
        "model": model,
        "ratios_per_layer": {
            "xla_flops_over_model_flops_outside_fused": flops.get("per_layer", float("nan"))
            / mf["per_layer"],
            "xla_non_matmul_bytes_over_model": nm_x["per_layer"] / nm_m["per_layer"],
        },
        "ratios_fixed": {
            "xla_flops_over_model_flops_outside_fused": flops.get("fixed", float("nan"))
            / mf["fixed"],
            "xla_non_matmul_bytes_over_model": nm_x["fixed"] / nm_m["fixed"],
        },
        "what_if_xla_non_matmul_bytes": {
            "note": "the per-layer non-matmul bytes XLA's program moves beyond the model's, × the "
            "row's layers, at the model's HBM rate: seconds the prediction would gain if each ran "
            "alone at that rate (not applied to the model)",
            "full_layers": full_layers,
            "extra_s": (nm_x["per_layer"] - nm_m["per_layer"]) * full_layers / hb,
            "predicted_step_s": predicted_full,
            "measured_step_s": measured,
            "gap_s": measured - predicted_full,
        },
    }
    if not gpu and "per_layer" in xla["optimal_seconds"]:
        outside = (
            model["compute_plus_recompute_s"]["per_layer"] - model["fused_attention_s"]["per_layer"]
        )
        out["ratios_per_layer"]["xla_optimal_s_over_model_time_outside_fused"] = (
            xla["optimal_seconds"]["per_layer"] / outside
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rows",
        metavar="ID[,ID...]",
        default=",".join(ROWS),
        help=f"rows to check (default {','.join(ROWS)}; choose from {', '.join(ROWS)})",
    )
    _common.add_out(ap, "xla_cost_check.json")
    ap.add_argument("--hlo-dir", metavar="DIR", help="keep each compile's scheduled HLO here")
    ap.add_argument(
        "--child", nargs=4, metavar=("ROW", "LAYERS", "UNROLL", "MESH"), help=argparse.SUPPRESS
    )
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="reuse the compiles a previous run left in --hlo-dir (their JSON beside the HLO)",
    )
    ap.add_argument("--probes", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-windowed", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--on-device", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        row, layers, unroll, mesh = args.child
        hlo_out = (
            str(
                pathlib.Path(args.hlo_dir)
                / f"{row}_L{layers}_u{unroll}{'-nowin' if args.no_windowed else ''}"
                f"{'-dev' if args.on_device else ''}.hlo"
            )
            if args.hlo_dir
            else None
        )
        got = compile_one(
            row, int(layers), int(unroll), mesh, hlo_out, not args.no_windowed, args.on_device
        )
        print(json.dumps(got))
        return 0
    if args.probes:
        print(json.dumps(probes()))
        return 0
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        ap.error(f"--rows: {', '.join(unknown)} not checked here; choose from {', '.join(ROWS)}")
    if args.hlo_dir and not pathlib.Path(args.hlo_dir).is_dir():
        ap.error(f"--hlo-dir {args.hlo_dir!r} is not a directory; create it")
    me = [sys.executable, str(pathlib.Path(__file__).resolve())]

    def child(extra: list[str]) -> tuple[dict, _common.Run]:
        p = _common.run([*me, *extra], timeout=TIMEOUT_S, cwd=_common.ROOT)
        if p.returncode != 0 or not p.stdout.strip():
            raise SystemExit(f"{' '.join(extra)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        return json.loads(p.stdout.strip().splitlines()[-1]), p

    if args.reuse and not args.hlo_dir:
        ap.error("--reuse reads the compiles of --hlo-dir; give --hlo-dir DIR")
    probe_file = pathlib.Path(args.hlo_dir) / "probes.json" if args.hlo_dir else None
    if args.reuse and probe_file and probe_file.is_file():
        probe = json.loads(probe_file.read_text())
    else:
        print("probes", file=sys.stderr)
        probe, _ = child(["--probes"])
        if probe_file:
            probe_file.write_text(json.dumps(probe))
    published = {r["id"]: r for r in pr.load_data(pr.DATA)["runs"]}
    whole = json.loads((_common.RESULTS / "published_runs.json").read_text())
    predicted = {r["id"]: r.get("predicted_step_s") for r in whole["rows"]}
    from tierax.models import get_config

    out_rows = []
    for row in rows:
        mesh = ROWS[row]["mesh"]
        run = published[row]
        full_layers = get_config(pr.EXPRESS[row]["model"]).num_layers
        sets, models, comparisons = {}, {}, {}
        for cs in ROWS[row]["sets"]:
            windowed, on_device = cs.get("windowed", True), cs.get("on_device", False)
            tag = ("" if windowed else "-nowin") + ("-dev" if on_device else "")
            compiles = {}
            for layers, unroll in cs["variants"]:
                print(f"{row}: {cs['name']}: {layers} layers, {unroll} per trip", file=sys.stderr)
                extra = ["--child", row, str(layers), str(unroll), mesh]
                extra = (["--no-windowed"] if not windowed else []) + extra
                extra = (["--on-device"] if on_device else []) + extra
                if args.hlo_dir:
                    extra = ["--hlo-dir", args.hlo_dir, *extra]
                cached = (
                    pathlib.Path(args.hlo_dir) / f"{row}_L{layers}_u{unroll}{tag}.json"
                    if args.hlo_dir
                    else None
                )
                if args.reuse and cached and cached.is_file():
                    got = json.loads(cached.read_text())
                else:
                    got, p = child(extra)
                    got["peak_rss_gib"] = (p.peak_rss_bytes or 0) / 2**30
                    if cached:
                        cached.write_text(json.dumps(got))
                compiles[f"{layers}x{unroll}"] = got
            depths = sorted({n for n, _ in cs["variants"]})
            ms = [model_side(row, n, mesh, on_device) for n in (depths[0], depths[-1])]
            sets[cs["name"]] = compiles
            models[cs["name"]] = {str(m["num_layers"]): m for m in ms}
            if cs.get("solve", True):
                comparisons[cs["name"]] = compare(
                    compiles, *ms, full_layers, run["measured_step_s"], predicted[row]
                )
        out_rows.append(
            {
                "id": row,
                "published": run,
                "mesh_compiled": mesh,
                "mesh_changed": mesh != pr.EXPRESS[row]["mesh"],
                "expressed": pr.EXPRESS[row],
                "compiles": sets,
                "model": models,
                "comparison": comparisons,
            }
        )
    doc = _common.envelope("tierax.xla_cost_check/1", argv) | {
        "versions": _common.versions("jax", "jaxlib", "libtpu", "jax-cuda13-plugin", "flax"),
        "note": "XLA's cost_analysis and scheduled HLO of tierax's step, compiled deviceless at "
        "2 and 4 layers, beside the cost model's terms for the same configs; nothing fitted, no "
        "TPU or GPU ran",
        **probe,
        "rows": out_rows,
    }
    _common.write_record(args.out, doc)
    for r in out_rows:
        for name, c in r["comparison"].items():
            print(r["id"], name, json.dumps(c["ratios_per_layer"]))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.TimeoutExpired as e:
        sys.exit(f"a compile ran past {e.timeout} s")
