#!/usr/bin/env python3
"""Non-matmul HBM traffic: the cost model's estimate (tierax.tracing.hbm) against XLA's own fusions.

For each case, a deviceless XLA:GPU compile of the train step (``tierax compile``'s, same shapes,
plan and mesh), and in its scheduled HLO every instruction that runs on the stream and is not a
matmul (no ``dot``/cuBLAS GEMM inside), not a collective, not a host copy and not free (parameter,
tuple, bitcast ...): XLA's fusions, copies, sorts, scatters, the optimizer's update.  Each one's
HBM bytes are its operands read plus its outputs written, executions of its loop multiplied in, with
in-place and sliced access counted as XLA performs it: a fusion parameter used only through
``dynamic-slice`` reads the slices, the buffer a ``dynamic-update-slice`` writes in place is neither
read nor rewritten (only the update is).  Seconds at the target's HBM bandwidth.  This reader is
independent of tierax.tracing.hbm (which counts fusions on the traced jaxpr), and also reports the
static roofline's byte count that ``tierax.xla.hlo.host_transfers`` uses (whole operands and
outputs).

Writes bench/results/hbm_time.json (command, machine, jax version, per case both sides by part).

What the record shows, case by case and where the two sides part, is in the HBM-traffic
paragraph of docs/concepts/cost-model.md, from bench/results/hbm_time.json.

    .venv/bin/python bench/hbm_time.py [--out bench/results/hbm_time.json] [--case N ...]
"""

from __future__ import annotations

import re
import time

import _common

from tierax import launch

CASES = [
    # model, overrides, plan, target, microbatch, seq, mesh
    ("llama3-8b", [], "remat-full", "h200", 2, 4096, ""),
    ("llama3-8b", [], "save-all", "h200", 2, 4096, ""),
    ("llama3-8b", [], "deepseek-offload", "b200", 4, 2048, ""),
    ("deepseek-v3-671b", ["num_layers=5"], "remat-full", "gb200", 1, 4096, "expert=8"),
    # XLA's attention (materialised [B, H, S, S] scores) instead of the blockwise default
    ("llama3-8b", ["attention=xla"], "remat-full", "h200", 1, 2048, ""),
    ("llama3-8b", ["attention=xla"], "save-all", "h200", 1, 2048, ""),
]

SKIP = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "while",
    "conditional",
    "call",
    "after-all",
    "partition-id",
    "replica-id",
    "opt-barrier",
    "add-dependency",
    "domain",
}
COLLECTIVE = (
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "send",
    "recv",
    "ragged-all-to-all",
    "collective-broadcast",
)


def _fused_io(module, ins) -> tuple[float, float]:
    """(bytes read, bytes written) of one fusion: sliced and in-place access as XLA does it."""
    comp = module.computations.get(ins.attr("calls") or "", [])
    params = {}
    for i in comp:
        if i.opcode == "parameter":
            m = re.match(r"\s*(\d+)", i.attrs) or re.search(
                r"parameter\((\d+)\)", i.type_text + i.attrs
            )
            params[i.name] = int(m.group(1)) if m else None
    users: dict[str, list] = {}
    for i in comp:
        for o in i.operands:
            users.setdefault(o, []).append(i)

    def uses(name: str) -> list[tuple[str, object]]:
        """(the name used, user) of every use of ``name``, through bitcasts."""
        out = []
        for u in users.get(name, []):
            out += uses(u.name) if u.opcode == "bitcast" else [(name, u)]
        return out

    read = 0.0
    for name, idx in params.items():
        us = uses(name)
        full = (
            module.by_name[ins.operands[idx]].out_bytes
            if idx is not None and idx < len(ins.operands)
            else 0.0
        )
        if us and all(u.opcode == "dynamic-slice" and u.operands[0] == n for n, u in us):
            read += sum(u.out_bytes for _, u in us)
        elif us and all(u.opcode == "dynamic-update-slice" and u.operands[0] == n for n, u in us):
            pass  # the buffer updated in place
        else:
            read += full
    root = module.by_name.get(module.roots.get(ins.attr("calls") or "", ""))
    outs = (
        [module.by_name[o] for o in root.operands]
        if root is not None and root.opcode == "tuple"
        else [root]
    )
    written = 0.0
    for r in outs:
        if r is None:
            continue
        if r.opcode == "dynamic-update-slice":
            written += (
                module.by_name[r.operands[1]].out_bytes if r.operands[1] in module.by_name else 0.0
            )
        else:
            written += r.out_bytes
    return read, written


def io_bytes(module, ins, pnum: dict[str, int]) -> tuple[float, float]:
    """(bytes read, bytes written) of one scheduled instruction: a fusion's as :func:`_fused_io`
    reads them (its parameters first numbered from ``pnum``, parameter name → number), the update
    of a ``dynamic-update-slice`` (in place), a ``dynamic-slice``'s slice, else every operand whole
    and the output."""
    op = ins.opcode
    if op == "fusion":
        for i in module.computations.get(ins.attr("calls") or "", []):
            if i.opcode == "parameter" and i.name in pnum:
                i.attrs = f"{pnum[i.name]}"
        return _fused_io(module, ins)
    if op == "dynamic-update-slice":
        upd = module.by_name.get(ins.operands[1])
        return (upd.out_bytes, upd.out_bytes) if upd else (0.0, 0.0)
    if op == "dynamic-slice":
        return ins.out_bytes, ins.out_bytes
    return module.operand_bytes(ins), ins.out_bytes


def xla_non_matmul(text: str, hbm_bps: float, rows: list | None = None) -> dict:
    from tierax.xla import hlo

    module = hlo.parse_module(text)
    # parameter numbers: "parameter(3)" is parsed with the 3 as an operand-less call; read it from
    # the text
    pnum = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"%([\w.\-]+) = [^\n]*? parameter\((\d+)\)", text)
    }
    execs = module.executions()
    scheduled = {module.entry}
    frontier = [module.entry]
    while frontier:
        c = frontier.pop()
        for ins in module.computations.get(c, []):
            for key in ("body", "condition", "to_apply", "true_computation", "false_computation"):
                child = ins.attr(key)
                if (
                    child
                    and ins.opcode in ("while", "call", "conditional")
                    and child not in scheduled
                ):
                    scheduled.add(child)
                    frontier.append(child)
            m = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
            for child in re.findall(r"%?([\w.\-]+)", m.group(1)) if m else []:
                if child not in scheduled:
                    scheduled.add(child)
                    frontier.append(child)
    total = naive = loops = 0.0
    by_kind: dict[str, float] = {}
    for c in scheduled:
        for ins in module.computations[c]:
            op = ins.opcode
            if (
                op in SKIP
                or op.endswith(("-start", "-done", "-update"))
                or op.startswith(COLLECTIVE)
            ):
                continue
            if module.instruction_flops(ins) > 0 or (
                op == "custom-call" and ("gemm" in ins.attrs or "cublas" in ins.attrs)
            ):
                continue
            n = execs.get(c, 1)
            r, w = io_bytes(module, ins, pnum)
            total += n * (r + w)
            if rows is not None:
                rows.append((n * (r + w), n, r, w, c, ins.name, ins.type_text[:90]))
            naive += n * (module.operand_bytes(ins) + ins.out_bytes)
            if c != module.entry:
                loops += n * (r + w)
            kind = (
                op
                if op != "fusion"
                else (
                    re.search(r"kind=(\w+)", ins.attrs).group(1)
                    if "kind=" in ins.attrs
                    else "fusion"
                )
            )
            by_kind[kind] = by_kind.get(kind, 0.0) + n * (r + w)
    return {
        "bytes": total,
        "seconds": total / hbm_bps,
        "bytes_in_loops": loops,
        "bytes_outside_loops": total - loops,
        "bytes_by_kind": by_kind,
        "static_roofline_bytes": naive,
    }


def model_side(cfg, plan, mb: int, seq: int, mesh: dict, rates) -> dict:
    from tierax import plan as plan_lib
    from tierax.tracing import hbm
    from tierax.tracing import inventory as inv_lib

    inv = inv_lib.for_plan(inv_lib.model_inventory(cfg, mb, seq, mesh), plan, cfg)
    placements = plan_lib.resolve(plan, cfg)
    fwd = sum(g.forward_hbm_bytes_per_layer * g.num_layers for g in inv.groups)
    bwd = sum(g.backward_hbm_bytes_per_layer * g.num_layers for g in inv.groups)
    rec = 0.0
    for g in inv.groups:
        mine = {a.name: a for a in g.activations if a.name != "decoder_layer_input"}
        pl = placements.get(g.name, {})
        if all(pl.get(n) is plan_lib.Placement.DEVICE for n in mine):
            continue
        rec += g.num_layers * (
            g.base_recompute_hbm_bytes_per_layer
            + sum(
                a.recompute_hbm_bytes_per_layer
                for n, a in mine.items()
                if pl.get(n) is plan_lib.Placement.REMAT
            )
        )
    opt = hbm.optimizer_bytes(inv.param_bytes)
    total = fwd + bwd + rec + inv.loss_hbm_bytes + opt
    return {
        "bytes": total,
        "seconds": total / rates.hbm_bytes_per_s,
        "layers_forward": fwd,
        "layers_backward": bwd,
        "recompute": rec,
        "loss": inv.loss_hbm_bytes,
        "optimizer": opt,
        "bytes_in_loops": fwd + bwd + rec + (inv.loss_hbm_bytes if cfg.loss_tiles > 1 else 0.0),
    }


def run_case(case) -> dict:
    import jax

    from tierax import costmodel, hardware
    from tierax import plan as plan_lib
    from tierax.mesh import MeshShape
    from tierax.models.config import for_platform, get_config
    from tierax.models.config_files import apply_overrides
    from tierax.xla import compile as compile_lib

    model, overrides, plan_name, target, mb, seq, mesh_text = case
    cfg = apply_overrides(get_config(model), [f"{o}" for o in overrides])
    cfg = for_platform(cfg, hardware.platform(target))
    mesh = dict((k, int(v)) for k, v in (kv.split("=") for kv in mesh_text.split(",") if kv))
    shape = MeshShape(**mesh)
    plan = plan_lib.load_plan(plan_name, cfg)
    rates = costmodel.target_rates(target, cfg.dtype)
    t0 = time.perf_counter()
    result, text = compile_lib.compile_for_target(
        cfg, plan, target, microbatch=mb, seq=seq, mesh=shape
    )
    compile_s = time.perf_counter() - t0
    xla = xla_non_matmul(text, rates.hbm_bytes_per_s)
    t0 = time.perf_counter()
    mine = model_side(cfg, plan, mb, seq, shape.to_dict(), rates)
    model_s = time.perf_counter() - t0
    cmd = [
        "tierax",
        "compile",
        "--model",
        model,
        *sum((["--set", o] for o in overrides), []),
        "--plan",
        plan_name,
        "--target",
        target,
        "--microbatch",
        str(mb),
        "--seq",
        str(seq),
    ] + (["--mesh", mesh_text] if mesh_text else [])
    return {
        "command": " ".join(cmd),
        "devices": shape.size,
        "hbm_bytes_per_s": rates.hbm_bytes_per_s,
        "xla": xla,
        "model": mine,
        "ratio_model_to_xla": mine["bytes"] / xla["bytes"],
        "ratio_in_loops": mine["bytes_in_loops"] / xla["bytes_in_loops"]
        if xla["bytes_in_loops"]
        else None,
        "compile_s": compile_s,
        "model_s": model_s,
        "jax_version": jax.__version__,
    }


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "hbm_time.json")
    ap.add_argument(
        "--case", type=int, action="append", help="case index (repeatable; default all)"
    )
    args = ap.parse_args(argv)
    launch.start(preset="none", deviceless_gpu=True)
    rows = []
    for k in args.case or range(len(CASES)):
        row = run_case(CASES[k])
        rows.append(row)
        x, m = row["xla"], row["model"]
        print(
            f"{row['command']}: model {m['bytes'] / 1e9:.1f} GB ({m['seconds'] * 1e3:.1f} ms), XLA "
            f"{x['bytes'] / 1e9:.1f} GB ({x['seconds'] * 1e3:.1f} ms), ratio "
            f"{row['ratio_model_to_xla']:.2f}; in loops {m['bytes_in_loops'] / 1e9:.1f} vs "
            f"{x['bytes_in_loops'] / 1e9:.1f}; static roofline bytes "
            f"{x['static_roofline_bytes'] / 1e9:.1f}",
            flush=True,
        )
    record = _common.envelope("tierax.hbm_time/1", argv) | {
        "note": "per device, per step; XLA side: deviceless XLA:GPU compile's scheduled HLO, "
        "non-matmul instructions",
        "cases": rows,
    }
    _common.write_record(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
