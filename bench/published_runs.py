#!/usr/bin/env python3
"""Measured production runs as the check: each published MaxText run, expressed as a tierax model,
mesh, plan and precision, predicted by the cost model beside its measured step time.

The runs are ``bench/data/published_runs.yaml`` (each with its public source): MaxText recipes on
H100/H200 and TPU v6e/v5p/v7x, and pairs of runs that differ only in their placement.  Every row
is listed: one tierax cannot express yet says what is missing (a row is never dropped).  Nothing is
fitted to these runs: every rate the prediction uses is named in its ``rates`` (datasheets, the
NCCL maintainers' per-NIC figure, papers), decided before this comparison.  No compile runs here:
the predictions are the cost model's (``simulate``, schedule ``lhs``: MaxText's GPU recipes set
XLA's latency-hiding scheduler, which XLA:TPU always runs).

How each row is expressed (:data:`EXPRESS`): the model is MaxText's named config; the mesh is the
row's (ICI × DCN folded into tierax's axes, devices laid out as tierax lays them); the plan is the
row's remat policy as MaxText ``custom`` keys (presets spelled out as the yaml's header defines
them; ``qkv_proj`` names MaxText's fused q/k/v projection, which its GPU and TPU configs do not
fuse, so it names nothing there and is dropped); precision: bf16 compute and float32 weights unless
the row says otherwise; attention as the row ran it.

``--data FILE`` runs another file of the same form (``runs``, and optionally ``pairs``):
``bench/data/holdout_runs.yaml`` holds measured runs that are not in the default file, read after
the cost model's terms were set, so a term tuned to the default rows shows there.  Its rows are
expressed by the same :data:`EXPRESS` table (ids ``H-*``); without ``--out`` the record is
``bench/results/<data file's stem>.json``.

    .venv/bin/python bench/published_runs.py      # → bench/results/published_runs.json and a table
    .venv/bin/python bench/published_runs.py --data bench/data/holdout_runs.yaml \
        --out bench/results/holdout_runs.json     # the holdout: runs no term was compared with
    .venv/bin/python bench/published_runs.py --docs bench/results/published_runs.json  # docs table
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import statistics
import sys

import _common
import yaml

from tierax import launch

DATA = pathlib.Path(__file__).resolve().parent / "data" / "published_runs.yaml"
HOLDOUT = DATA.parent / "holdout_runs.yaml"
RUN_FIELDS = ("id", "hw", "devices", "model", "measured_step_s", "source")  # every row has these
SCHEDULE = "lhs"
WITHIN = 0.15  # the bar for each row
MEDIAN = 0.08

Q, K, V, OUT = "query_proj", "key_proj", "value_proj", "out_proj"
LIN = "decoder_layer_input"
ALL_MATMULS_NAMES = (Q, K, V, OUT, "mlpwi_0", "mlpwi_1", "mlpwo")  # every weight matmul's output


def _custom(**placements: str) -> dict:
    """MaxText ``custom`` remat keys; every key not given is remat (the layer input: device)."""
    return {"remat_policy": "custom", **placements}


def _names(value: str, *names: str) -> dict:
    return {n: value for n in names}


# Row id → how tierax expresses it.  ``needs``: features the row depends on (checked against the
# code at run time: a row whose feature is missing is listed as not expressible, naming it).
EXPRESS: dict[str, dict] = {
    "G-2": dict(
        model="llama2-70b",
        mesh="fsdp=64",
        remat=_custom(**_names("device", Q, K, V, OUT, "mlpwo")),
        attention="cudnn",
    ),
    "G-3": dict(
        model="llama2-70b",
        mesh="fsdp=64",
        remat=_custom(**_names("device", Q, K, V, OUT)),
        attention="cudnn",
        set=["quantization=fp8"],
        needs=["fp8"],
    ),
    "G-4": dict(
        model="llama3-70b",
        mesh="fsdp=128",
        remat=_custom(**_names("device", Q, K, V)),  # save_qkv_proj
        attention="cudnn",
    ),
    "G-5": dict(
        model="llama3-70b",
        mesh="fsdp=128",
        remat=_custom(**_names("device", Q, K, V)),
        attention="cudnn",
        set=["quantization=fp8"],
        needs=["fp8"],
    ),
    "G-7": dict(
        model="mixtral-8x7b",
        mesh="data=16,fsdp=2,expert=8",
        # MaxText's MoE block tags its expert matmuls mlpwi_0/mlpwi_1/mlpwo; tierax's Mixtral tags
        # them moe_mlpwi_0/moe_mlpwi_1/moe_mlpwo
        remat=_custom(**_names("device", Q, K, V, OUT, "moe_mlpwi_0", "moe_mlpwi_1", "moe_mlpwo")),
        attention="cudnn",
        set=["param_dtype=bfloat16", "capacity_factor=1.0"],
        needs=["mixtral"],
    ),
    "TR-1": dict(
        model="llama3.1-8b",
        mesh="fsdp=8",
        remat=_custom(**_names("offload", LIN, OUT, Q, K, V)),
        attention="splash",
        needs=["splash"],
    ),
    "TR-3": dict(
        model="llama3.1-70b",
        mesh="fsdp=32",
        remat=_custom(**_names("offload", LIN, Q, K, V)),
        attention="splash",
        set=["param_dtype=bfloat16"],
        needs=["splash"],
    ),
    "TR-4": dict(
        model="llama3.1-70b",
        mesh="fsdp=64",
        remat=_custom(**_names("offload", LIN, Q, K, V)),
        attention="splash",
        needs=["splash"],
    ),
    "TR-7": dict(
        model="llama3.1-405b",
        mesh="fsdp=512",
        remat=_custom(**_names("offload", LIN)),
        attention="splash",
        needs=["splash", "v6e-dcn"],
    ),
    "TR-9": dict(
        model="llama2-70b",
        mesh="fsdp=256",
        remat=_custom(**_names("offload", Q, K, V)),  # qkv_proj_offloaded
        attention="splash",
        needs=["splash"],
    ),
    "TR-10": dict(
        model="mixtral-8x7b",
        mesh="fsdp=256",
        remat=_custom(**_names("offload", LIN, OUT, Q, K, V)),
        attention="splash",
        set=["capacity_factor=1.25"],
        needs=["splash", "mixtral"],
    ),
    "P-7": dict(
        model="deepseek3-671b",
        mesh="fsdp=512",
        remat=_custom(**_names("offload", LIN, OUT)),
        attention="splash",
        set=["moe_impl=ragged"],
        needs=["splash", "grouped-matmul"],
    ),
    "IW-1": dict(
        model="deepseek3-671b",
        mesh="fsdp=256",
        remat=_custom(**_names("offload", LIN)),
        attention="splash",
        set=["mu_dtype=bfloat16", "moe_impl=ragged"],
        needs=["v7x", "splash", "grouped-matmul"],
    ),
    "IW-2": dict(
        model="deepseek3-671b",
        mesh="fsdp=256",
        remat=_custom(**_names("offload", LIN)),
        attention="splash",
        set=["mu_dtype=bfloat16", "quantization=fp8", "moe_impl=ragged"],
        needs=["v7x", "splash", "grouped-matmul", "fp8"],
    ),
    "IW-4": dict(
        model="llama3.1-70b",
        mesh="fsdp=128",
        remat=_custom(**_names("device", LIN, "context", Q, K, V)),
        attention="splash",
        set=["mu_dtype=bfloat16"],
        needs=["v7x", "splash"],
    ),
    "IW-6": dict(
        model="llama3.1-70b",
        mesh="fsdp=128",
        remat=_custom(**_names("device", LIN, "context", Q, K, V)),
        attention="splash",
        set=["quantization=fp8"],
        needs=["v7x", "splash", "fp8"],
    ),
    "IW-8": dict(
        model="llama3.1-405b",
        mesh="fsdp=512",
        remat=_custom(**_names("offload", LIN, "mlpwo"), **_names("device", K, V)),
        attention="splash",
        set=["mu_dtype=bfloat16", "loss_tiles=4"],
        needs=["v7x", "splash"],
    ),
    # The holdout (bench/data/holdout_runs.yaml): written from each row's fields as above, nothing
    # chosen by its measured time.  ``missing``: a fact the row's sources do not give.
    "H-1": dict(
        model="llama3.1-70b",
        mesh="data=2,fsdp=128",
        # save_dot_with_context_except_mlp
        remat=_custom(**_names("device", Q, K, V, "context", OUT)),
        attention="cudnn",
    ),
    "H-2": dict(
        model="llama2-7b",
        mesh="data=32,fsdp=8",
        # minimal_flash: every weight matmul's output and the attention output kept; tierax prices a
        # scanned layer stack (the run was unscanned: same FLOPs and bytes per layer)
        remat=_custom(**_names("device", *ALL_MATMULS_NAMES, "context")),
        attention="cudnn",
    ),
    "H-3": dict(
        model="llama3.1-405b",
        mesh="fsdp=512",
        remat=_custom(**_names("offload", "context", "mlpwo")),
        attention="splash",
        set=["loss_tiles=4"],
        needs=["splash"],
    ),
    "H-4": dict(
        model_fields=dict(
            family="llama",
            name="mistral-7b",
            vocab_size=32000,
            d_model=4096,
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            mlp_dim=14336,
            rope_theta=1_000_000.0,
            norm_eps=1e-5,
            tie_embeddings=False,
            dtype="bfloat16",
        ),
        mesh="fsdp=8",
        remat=_custom(**_names("offload", LIN, OUT, Q, K, V)),
        attention="splash",
        needs=["splash"],
    ),
    "H-5": dict(
        model_fields=dict(
            family="llama",
            name="mixtral-8x22b",
            vocab_size=32768,
            d_model=6144,
            num_layers=56,
            num_heads=48,
            num_kv_heads=8,
            head_dim=128,
            mlp_dim=16384,
            rope_theta=1_000_000.0,
            norm_eps=1e-5,
            tie_embeddings=False,
            num_experts=8,
            num_experts_per_tok=2,
            dtype="bfloat16",
        ),
        mesh="fsdp=64,expert=4",
        remat=_custom(**_names("offload", LIN, OUT, Q, K, V)),
        attention="splash",
        set=["param_dtype=bfloat16", "capacity_factor=1.25"],
        needs=["splash", "mixtral"],
    ),
    "H-6": dict(
        missing=["the precision the published log line ran (bf16 or fp8: both configs match it)"],
    ),
    "H-7": dict(
        model="llama3.1-405b",
        mesh="data=2,fsdp=128",
        remat=_custom(),  # full
        attention="cudnn",
        set=["quantization=fp8"],
        needs=["fp8"],
    ),
}

# The pairs: (label, placement) × 2, same model, hardware, mesh and shape; ``better`` is the one
# measured faster.
LLAMA_128B = dict(
    family="llama",
    name="llama-128b",
    vocab_size=32000,
    d_model=8192,
    num_layers=64,
    num_heads=128,
    num_kv_heads=128,
    head_dim=128,
    mlp_dim=57344,
    rope_theta=10_000.0,
    dtype="bfloat16",
)
ALL_MATMULS = ALL_MATMULS_NAMES
PAIRS: dict[str, dict] = {
    "E-3/E-4": dict(
        model_fields=LLAMA_128B,
        hw="v5e",
        mesh="fsdp=16,tensor=16",
        microbatch=1,
        seq=2048,
        attention="splash",
        plans={
            "full": _custom(),
            "minimal_offloaded": _custom(**_names("offload", *ALL_MATMULS)),
        },
        better="minimal_offloaded",
        needs=["splash"],
    ),
    "P-5": dict(
        model="llama2-70b",
        hw="v5p",
        mesh="fsdp=64",
        microbatch=4,  # not stated; 4 × 4096 in the era's recipe
        seq=4096,
        attention="splash",
        plans={"without offload (q/k/v recomputed)": _custom(), "qkv_proj_offloaded": None},
        better="qkv_proj_offloaded",
        needs=["splash"],
    ),
    "seed": dict(
        model="llama3.1-405b",
        hw="gb200",
        mesh="fsdp=128",
        microbatch=2,
        seq=8192,
        attention="cudnn",
        set=["quantization=fp8"],
        plans={"remat": _custom(), "q/k/v offloaded": _custom(**_names("offload", Q, K, V))},
        better="q/k/v offloaded",
        needs=["fp8"],
    ),
}
PAIRS["P-5"]["plans"]["qkv_proj_offloaded"] = _custom(**_names("offload", Q, K, V))


def available() -> dict[str, str | None]:
    """Feature → None where the code has it, else what is missing."""
    from tierax import hardware
    from tierax.models import config as C
    from tierax.models import get_config

    fields = {f.name for f in dataclasses.fields(C.LlamaConfig)}
    out: dict[str, str | None] = {
        "fp8": None if "quantization" in fields else "fp8 training (quantization: fp8)",
        "splash": None
        if "splash" in C.ATTENTION_IMPLS
        else "the splash-attention kernel (attention: splash)",
        "v7x": None if "v7x" in hardware.TPU_TARGETS else "the v7x target",
        "grouped-matmul": None
        if any("ragged" in f or "grouped" in f for f in fields) or hasattr(C, "MOE_IMPLS")
        else "grouped-matmul (dropless) MoE",
    }
    try:
        get_config("mixtral-8x7b")
        out["mixtral"] = None
    except Exception:
        out["mixtral"] = "a Mixtral-style MoE model"
    v6e = hardware.TPU_TARGETS.get("v6e")
    out["v6e-dcn"] = (
        None
        if v6e is not None and v6e.scale_out_bytes_per_s > 0
        else "a sourced v6e DCN rate per chip (a two-slice job crosses the data-center network)"
    )
    return out


def _config(spec: dict, attention: str):
    from tierax.models import apply_overrides, config_from_dict, get_config

    if "model_fields" in spec:
        cfg = config_from_dict(dict(spec["model_fields"]), source="bench/published_runs.py")
    else:
        cfg = get_config(spec["model"])
    cfg = apply_overrides(cfg, [f"attention={attention}", *spec.get("set", [])])
    return cfg


def _plan(remat: dict, cfg, hardware_kind: str, label: str):
    from tierax import plan as P
    from tierax.interop import maxtext_keys

    groups = {g.name: g.activations for g in cfg.layer_groups()}
    data = {"hardware": hardware_kind, **remat}
    return P.Plan.from_dict(maxtext_keys.plan_dict(data, groups, source=label))


def predict(spec: dict, hw: str, microbatch: int, seq: int, remat: dict, label: str) -> dict:
    from tierax import costmodel as cm
    from tierax import hardware
    from tierax.mesh import parse_mesh
    from tierax.tracing import inventory as inv_lib

    cfg = _config(spec, spec.get("attention", "auto"))
    mesh = parse_mesh(spec["mesh"], None).to_dict()
    plan = _plan(remat, cfg, "gpu" if hardware.platform(hw) == "gpu" else "tpu", label)
    inv = inv_lib.model_inventory(cfg, microbatch, seq, mesh)
    rates = cm.target_rates(hw, cfg.dtype)
    pred = cm.simulate(plan, inv, cfg, rates, SCHEDULE)
    b = pred.breakdown
    keys = (
        "compute_s",
        "hbm_s",
        "fused_attention_s",
        "recompute_s",
        "exposed_d2h_s",
        "exposed_h2d_s",
        "collective_s",
        "critical_collective_s",
        "exposed_collective_s",
        "transfer_s",
    )
    return {
        "config": {"model": cfg.name, "attention": cfg.attention, "set": spec.get("set", [])},
        "mesh": mesh,
        "plan": plan.to_dict(),
        "fits": pred.fits,
        # the peak `fits` is decided by (XLA:TPU's assignment; tierax.costmodel.predict), and what
        # the installed libtpu's memory_analysis() would report beyond it
        "peak_gib": pred.breakdown["assigned_peak_bytes"] / 2**30,
        "reported_excess_gib": pred.breakdown["reported_excess_bytes"] / 2**30,
        "usable_gib": rates.usable_device_bytes / 2**30,
        "host_gib": pred.host_bytes / 2**30,
        "predicted_step_s": pred.step_time_s,
        "terms": {k: b[k] for k in keys}
        | {"matmul_s": b["compute_s"] - b["hbm_s"] - b["fused_attention_s"]},
        "peak_phase": b["peak_phase"],
        "network": b["network"],
        "rates": b["rates"],
    }


def load_data(path: str | pathlib.Path) -> dict:
    """The runs file ``path`` (``runs``: a list of rows, each with :data:`RUN_FIELDS`; ``pairs``:
    optional), checked before any work.

    Raises:
      TieraxError: the file is missing or not YAML, has no ``runs`` list, or a row lacks a field,
        repeats an id or gives a measured step time that is not a positive number.
    """
    from tierax.errors import TieraxError

    p = pathlib.Path(path)
    if not p.is_file():
        raise TieraxError(f"--data {str(p)!r} is not a file; give a runs file such as {DATA.name}")
    try:
        data = yaml.safe_load(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise TieraxError(f"--data {str(p)!r} is not YAML ({e}); fix the file") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list) or not data["runs"]:
        raise TieraxError(f"--data {str(p)!r}: needs a non-empty 'runs' list (as in {DATA.name})")
    pairs = data.setdefault("pairs", [])
    if not isinstance(pairs, list) or not all(isinstance(q, dict) and "id" in q for q in pairs):
        raise TieraxError(f"--data {str(p)!r}: 'pairs' must be a list of mappings with an 'id'")
    seen: set = set()
    for i, run in enumerate(data["runs"]):
        if not isinstance(run, dict):
            raise TieraxError(f"--data {str(p)!r}: runs[{i}] is not a mapping; give its fields")
        lacking = [f for f in RUN_FIELDS if f not in run]
        if lacking:
            raise TieraxError(
                f"--data {str(p)!r}: run {run.get('id', i)!r} lacks {', '.join(lacking)}; every "
                f"run needs {', '.join(RUN_FIELDS)}"
            )
        if run["id"] in seen:
            raise TieraxError(f"--data {str(p)!r}: run id {run['id']!r} appears twice; rename one")
        seen.add(run["id"])
        t = run["measured_step_s"]
        if isinstance(t, bool) or not isinstance(t, int | float) or t <= 0:
            raise TieraxError(
                f"--data {str(p)!r}: run {run['id']!r} measured_step_s is {t!r}; give the measured "
                "step time in seconds (a positive number)"
            )
    return data


def row_missing(run: dict, spec: dict | None, have: dict[str, str | None]) -> list[str]:
    """What row ``run`` lacks to be predicted (empty: it is expressed by ``spec``): no expression
    written, facts its sources do not give, features the code does not have, shape fields absent."""
    if spec is None:
        return ["no expression written"]
    missing = list(spec.get("missing", []))
    missing += [have[n] for n in spec.get("needs", []) if have[n]]
    model = "model" in spec or "model_fields" in spec
    if not missing and not (model and "remat" in spec):
        missing.append("no expression written")
    missing += [f"the run's {f}: not in the data" for f in ("batch", "seq") if f not in run]
    return missing


def markdown(doc: dict) -> str:
    """The docs table of a record: one row per run (what is missing where it is not expressed)."""
    lines = [
        "| row | hardware | model | measured s | predicted s | predicted / measured | fits (GiB) |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in doc["rows"]:
        run = r["published"]
        where = f"{run['devices']} {run['hw']}"
        if not r["expressible"]:
            lines.append(
                f"| {r['id']} | {where} | {run['model']} | {run['measured_step_s']} | — | "
                f"not expressible: {'; '.join(r['missing'])} | — |"
            )
            continue
        fits = "yes" if r["fits"] else "**no**"
        lines.append(
            f"| {r['id']} | {where} | {run['model']} | {r['measured_step_s']:.3f} | "
            f"{r['predicted_step_s']:.3f} | {r['ratio']:.2f} | {fits} "
            f"({r['peak_gib']:.1f} of {r['usable_gib']:.1f}) |"
        )
    s = doc["summary"]
    med = s["median_abs_error"]
    lines += [
        "",
        f"{s['expressible']} of {s['rows']} rows expressed; {s['within_15_percent']} within 15 %"
        + (f", median |error| {med:.0%}" if med is not None else "")
        + f"; every expressed row predicted to fit: {'yes' if s['all_predicted_to_fit'] else 'no'}"
        + f"; pairs ordered as measured: {s['pairs_ordered_right']} of {s['pairs_expressible']}"
        + f" expressed (`{doc['command']}`, {doc['created'][:10]}).",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data",
        metavar="FILE.yaml",
        default=str(DATA),
        help=f"the runs to predict (default: bench/data/{DATA.name}; the holdout: "
        f"bench/data/{HOLDOUT.name})",
    )
    ap.add_argument(
        "--out",
        type=_common.out_path,
        metavar="FILE.json",
        help="the record to write (default: bench/results/<the --data file's stem>.json)",
    )
    ap.add_argument(
        "--docs",
        metavar="RECORD.json",
        help="rewrite the docs table from this record and exit (nothing is predicted)",
    )
    ap.add_argument(
        "--rows",
        metavar="ID[,ID...]",
        help="predict only these runs (ids of bench/data/published_runs.yaml, e.g. TR-10,IW-8) "
        "and no pairs; needs an --out other than the whole record's (a partial record never "
        "replaces it)",
    )
    args = ap.parse_args(argv)
    if args.docs:
        import json

        doc = json.loads(pathlib.Path(args.docs).read_text())
        # Each data file has its own docs table: the default runs and the holdout.
        markers = {
            str(DATA.relative_to(_common.ROOT)): "published-runs",
            str(HOLDOUT.relative_to(_common.ROOT)): "holdout-runs",
        }
        data = doc.get("data", str(DATA.relative_to(_common.ROOT)))
        if data not in markers:
            ap.error(
                f"--docs {args.docs!r} is a record of {data}; the docs have tables for "
                f"{' and '.join(markers)} only, so nothing is written"
            )
        print(f"wrote {_common.write_docs_table(markers[data], markdown(doc))}")
        return 0
    from tierax.errors import TieraxError

    try:
        data = load_data(args.data)
    except TieraxError as e:
        ap.error(str(e))
    if args.out is None:
        try:
            stem = pathlib.Path(args.data).stem
            args.out = _common.out_path(str(_common.RESULTS / f"{stem}.json"))
        except argparse.ArgumentTypeError as e:
            ap.error(f"--out: {e}")
    whole = (_common.RESULTS / f"{pathlib.Path(args.data).stem}.json").resolve()
    if args.rows and pathlib.Path(args.out).resolve() == whole:
        print(
            f"error: --rows writes a partial record; give --out FILE.json (not {whole}, the whole "
            "record, which only a run over every row rewrites)",
            file=sys.stderr,
        )
        return 2
    if args.rows:
        wanted = [r for r in args.rows.split(",") if r]
        known = [r["id"] for r in data["runs"]]
        unknown = [r for r in wanted if r not in known]
        if unknown:
            print(
                f"error: --rows: no run {', '.join(unknown)} in {pathlib.Path(args.data).name}; "
                f"choose from: {', '.join(known)}",
                file=sys.stderr,
            )
            return 2
        data["runs"] = [r for r in data["runs"] if r["id"] in wanted]
        data["pairs"] = []
    launch.start()

    from rich.console import Console
    from rich.table import Table

    have = available()
    rows = []
    for run in data["runs"]:
        spec = EXPRESS.get(run["id"])
        row = {"id": run["id"], "published": run, "measured_step_s": run["measured_step_s"]}
        missing = row_missing(run, spec, have)
        if missing:
            row["expressible"] = False
            row["missing"] = missing
            rows.append(row)
            continue
        name = spec.get("model") or spec["model_fields"]["name"]
        print(f"{run['id']}: {name} on {run['devices']} {run['hw']}", file=sys.stderr)
        row |= {"expressible": True, "expressed": spec}
        row |= predict(spec, run["hw"], run["batch"], run["seq"], spec["remat"], run["id"])
        row["ratio"] = row["predicted_step_s"] / run["measured_step_s"]
        rows.append(row)
    pairs = []
    for pub in data["pairs"]:
        spec = PAIRS.get(pub["id"])
        if spec is None:
            entry = {"id": pub["id"], "published": pub, "expressible": False}
            pairs.append(entry | {"missing": ["no expression written"]})
            continue
        missing = [have[n] for n in spec.get("needs", []) if have[n]]
        entry = {"id": pub["id"], "published": pub}
        if missing:
            pairs.append(entry | {"expressible": False, "missing": missing})
            continue
        preds = {
            label: predict(spec, spec["hw"], spec["microbatch"], spec["seq"], remat, pub["id"])
            for label, remat in spec["plans"].items()
        }
        fastest = min(preds, key=lambda k: preds[k]["predicted_step_s"])
        entry |= {
            "expressible": True,
            "predictions": preds,
            "measured_better": spec["better"],
            "predicted_better": fastest,
            "order_right": fastest == spec["better"],
        }
        pairs.append(entry)

    done = [r for r in rows if r["expressible"]]
    errors = [abs(r["ratio"] - 1) for r in done]
    summary = {
        "rows": len(rows),
        "expressible": len(done),
        "within_15_percent": sum(e <= WITHIN for e in errors),
        "median_abs_error": statistics.median(errors) if errors else None,
        "max_abs_error": max(errors) if errors else None,
        "all_predicted_to_fit": all(r["fits"] for r in done),
        "pairs_expressible": sum(p["expressible"] for p in pairs),
        "pairs_ordered_right": sum(p.get("order_right", False) for p in pairs),
        "goal": f"every expressible row within {WITHIN:.0%}, median ≤ {MEDIAN:.0%}, every "
        "row predicted to fit, every pair ordered as measured",
    }
    doc = _common.envelope("tierax.published_runs/1", argv) | {
        "data": str(pathlib.Path(args.data).resolve().relative_to(_common.ROOT))
        if pathlib.Path(args.data).resolve().is_relative_to(_common.ROOT)
        else str(args.data),
        "note": "cost-model predictions (simulate, schedule lhs) beside measured MaxText step "
        "times; no rate fitted to them; nothing compiled; no GPU or TPU ran",
        "summary": summary,
        "rows": rows,
        "pairs": pairs,
    }
    _common.write_record(args.out, doc)

    table = Table(title=f"published runs: predicted vs measured step (schedule {SCHEDULE})")
    for col in ("row", "hardware", "model", "measured s", "predicted s", "pred/meas", "fits"):
        table.add_column(col)
    for r in rows:
        run = r["published"]
        if not r["expressible"]:
            table.add_row(
                r["id"], f"{run['devices']} {run['hw']}", run["model"], f"{run['measured_step_s']}",
                "—", "not expressible: " + "; ".join(r["missing"]), "—",
            )
            continue
        table.add_row(
            r["id"],
            f"{run['devices']} {run['hw']}",
            run["model"],
            f"{r['measured_step_s']:.3f}",
            f"{r['predicted_step_s']:.3f}",
            f"{r['ratio']:.2f}",
            f"{'yes' if r['fits'] else 'NO'} ({r['peak_gib']:.1f} of {r['usable_gib']:.1f} GiB)",
        )
    Console(width=160).print(table)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
