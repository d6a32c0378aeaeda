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
from typing import TYPE_CHECKING

import _common
import yaml

from tierax import launch

if TYPE_CHECKING:  # tierax.calibration imports JAX: not before --help is answered
    from tierax.calibration import Run

DATA = pathlib.Path(__file__).resolve().parent / "data" / "published_runs.yaml"
HOLDOUT = DATA.parent / "holdout_runs.yaml"
RUNS_FILE = DATA.parent / "calibration_runs.yaml"  # the given rows as `tierax calibrate` reads them
CALIBRATION = DATA.parents[1] / "results" / "calibrated_rates.yaml"
PLOT = DATA.parents[2] / "docs" / "results" / "published-runs.png"
# Runs that differ only in precision (bf16, fp8): the fp8 one was measured faster in each.
PRECISION_PAIRS = (("G-2", "G-3"), ("G-4", "G-5"), ("IW-1", "IW-2"), ("IW-4", "IW-6"))
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


def _model_key(spec: dict) -> str:
    return "model_fields" if "model_fields" in spec else "model"


def _overrides(spec: dict) -> list[str]:
    return [f"attention={spec.get('attention', 'auto')}", *spec.get("set", [])]


def to_run(spec: dict, hw: str, microbatch: int, seq: int, remat: dict, label: str, measured):
    """A row (or one plan of a pair) as tierax's measured run (:class:`tierax.calibration.Run`):
    the one implementation that predicts it, here and in ``tierax calibrate --runs``."""
    from tierax.calibration import Run
    from tierax.mesh import parse_mesh

    key = _model_key(spec)
    return Run(
        name=label,
        target=hw,
        model_key=key,
        model=spec[key],
        mesh=parse_mesh(spec["mesh"], None).to_dict(),
        microbatch=microbatch,
        seq=seq,
        measured_s=float(measured or 1.0),  # a pair's plans have no step time of their own
        remat=remat,
        overrides=tuple(_overrides(spec)),
        schedule=SCHEDULE,
    )


def run_entry(run: Run) -> dict:
    """``run`` as an entry of a runs file (``tierax calibrate --runs``)."""
    entry = {"name": run.name, run.model_key: run.model, "set": list(run.overrides)}
    mesh = ",".join(f"{a}={n}" for a, n in run.mesh.items() if n > 1) or "fsdp=1"
    entry |= {"target": run.target, "mesh": mesh, "microbatch": run.microbatch, "seq": run.seq}
    entry |= {"remat": dict(run.remat), "schedule": run.schedule}
    return entry | {"step_seconds": run.measured_s}


def predict(
    spec: dict,
    hw: str,
    microbatch: int,
    seq: int,
    remat: dict,
    label: str,
    calibrated=None,
    prepared: list | None = None,
    measured: float | None = None,
) -> dict:
    """The row's prediction; ``calibrated`` (a CalibratedRates): also its calibrated step time;
    ``prepared``: where the traced run (measured at ``measured`` s) is appended."""
    from tierax.calibration import prepare

    p = prepare(to_run(spec, hw, microbatch, seq, remat, label, measured))
    if prepared is not None:
        prepared.append(p)
    cfg, rates = p.cfg, p.rates
    pred = p.predict()
    # the breakdown's JSON keys (a typed Breakdown's to_json, or the dict it was)
    b = pred.breakdown.to_json() if hasattr(pred.breakdown, "to_json") else pred.breakdown
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
        "interference_s",
        "transfer_s",
    )
    return {
        "config": {"model": cfg.name, "attention": cfg.attention, "set": spec.get("set", [])},
        "mesh": dict(p.run.mesh),
        "plan": p.plan.to_dict(),
        "fits": pred.fits,
        # the peak `fits` is decided by (XLA:TPU's assignment; tierax.costmodel.predict), and what
        # the installed libtpu's memory_analysis() would report beyond it
        "peak_gib": b["assigned_peak_bytes"] / 2**30,
        "reported_excess_gib": b["reported_excess_bytes"] / 2**30,
        "usable_gib": rates.usable_device_bytes / 2**30,
        "host_gib": pred.host_bytes / 2**30,
        "predicted_step_s": pred.step_time_s,
        "terms": {k: b[k] for k in keys}
        | {"matmul_s": b["compute_s"] - b["hbm_s"] - b["fused_attention_s"]},
        "split": pred.split.to_json(),
        "peak_phase": b["peak_phase"],
        "network": b["network"],
        "rates": b["rates"],
    } | (
        {
            "calibrated_step_s": cm_simulate(p, calibrated),
            "calibration": calibrated.describe(hw),
        }
        if calibrated is not None
        else {}
    )


def cm_simulate(p, calibrated) -> float:
    """The prepared run's step at ``calibrated``'s factors for its target (as ``--rates``)."""
    from tierax import costmodel as cm

    rates = calibrated.apply(p.rates)
    return cm.simulate(p.plan, p.program, rates, SCHEDULE, p.run.grad_accum).step_time_s


def load_data(path: str | pathlib.Path) -> dict:
    """The runs file ``path`` (``runs``: a list of rows, each with :data:`RUN_FIELDS`; ``pairs``:
    optional), checked before any work.

    Raises:
      TieraxError: the file is missing or not YAML, has no ``runs`` list, or a row lacks a field,
        repeats an id or gives a measured step time that is not a positive number.
    """
    from tierax.calibration.runs import read_runs_document
    from tierax.errors import TieraxError

    p = pathlib.Path(path)
    data = read_runs_document(p, "--data", f"such as {DATA.name}", f" (as in {DATA.name})")
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


def _shown(path: str) -> str:
    """``path`` relative to the repository where it lies inside it."""
    p = pathlib.Path(path).resolve()
    return str(p.relative_to(_common.ROOT)) if p.is_relative_to(_common.ROOT) else str(path)


def calibrated_columns(rows: list[dict], prepared: list, cal) -> None:
    """Each expressed row's calibrated prediction: for a row ``cal`` was fitted on, leave-one-out
    (its group's factors refitted here without it: the same factors, the same fit); for any other
    row, ``cal``'s factors for its target (what ``--rates`` applies)."""
    from tierax.calibration import fit_group

    by_name = {p.run.name: p for p in prepared}
    loo: dict[str, tuple[float, float]] = {}
    for key, fs in cal.groups.items():
        mine = [by_name[n] for n in fs.runs if n in by_name]
        if len(mine) != len(fs.runs):
            continue  # the rows of another file: the calibration is applied to these rows
        g = fit_group(key, mine, tuple(fs.factors))
        for name, e in g.errors.items():
            loo[name] = (e.loo_s, fs.runs[name].loo_s)
    for r in rows:
        if not r["expressible"]:
            continue
        if r["id"] in loo:
            s, committed = loo[r["id"]]
            r |= {"calibrated_kind": "leave-one-out", "calibrated_loo_step_s": s}
            r["calibrated_loo_in_file_s"] = committed
        else:
            r |= {"calibrated_kind": "applied", "calibrated_loo_step_s": None}
            s = r["calibrated_step_s"]
        r["calibrated_ratio"] = s / r["measured_step_s"]


def precision_pairs(rows: list[dict]) -> list[dict]:
    """Per bf16/fp8 pair of rows present: whether the sourced and the calibrated predictions order
    them as measured (the fp8 row faster)."""
    by_id = {r["id"]: r for r in rows if r["expressible"]}
    out = []
    for a, b in PRECISION_PAIRS:
        if a in by_id and b in by_id:
            ra, rb = by_id[a], by_id[b]
            measured = rb["measured_step_s"] < ra["measured_step_s"]
            cal = lambda r: r["calibrated_ratio"] * r["measured_step_s"]  # noqa: E731
            out.append(
                {
                    "bf16": a,
                    "fp8": b,
                    "sourced_order_right": (rb["predicted_step_s"] < ra["predicted_step_s"])
                    == measured,
                    "calibrated_order_right": (cal(rb) < cal(ra)) == measured,
                }
            )
    return out


def write_runs(data: dict, out: str, source: str) -> int:
    """Write ``data``'s expressible rows as a runs file for ``tierax calibrate --runs``."""
    from tierax.fileio import write_text_atomic

    have = available()
    entries = []
    for run in data["runs"]:
        spec = EXPRESS.get(run["id"])
        if row_missing(run, spec, have):
            continue
        r = to_run(
            spec,
            run["hw"],
            run["batch"],
            run["seq"],
            spec["remat"],
            run["id"],
            run["measured_step_s"],
        )
        entries.append(run_entry(r))
    head = (
        f"# The expressible rows of {pathlib.Path(source).name} as measured runs for `tierax "
        "calibrate --runs`\n# (written by `python bench/published_runs.py --write-runs "
        "FILE`; each row's source is in that file).\n"
    )
    text = head + yaml.safe_dump({"runs": entries}, sort_keys=False, width=100)
    print(f"wrote {write_text_atomic(out, text)} ({len(entries)} runs)")
    return 0


def plot(out: str) -> pathlib.Path:
    """Predicted vs measured step time of the given and holdout records, sourced and calibrated
    (one point per run and model), the ±15 % band drawn; written to ``out`` (a PNG)."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tierax.fileio import png_metadata

    records = {
        "given": json.loads((_common.RESULTS / "published_runs.json").read_text()),
        "holdout": json.loads((_common.RESULTS / "holdout_runs.json").read_text()),
    }
    fig, ax = plt.subplots(figsize=(7, 6.5))
    lo, hi = 0.8, 200.0
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", lw=0.8)
    ax.fill_between(xs, [x * 0.85 for x in xs], [x * 1.15 for x in xs], color="0.85", lw=0)
    styles = {
        ("given", "sourced"): dict(marker="o", mfc="none", color="tab:blue"),
        ("given", "calibrated"): dict(marker="o", color="tab:blue"),
        ("holdout", "sourced"): dict(marker="s", mfc="none", color="tab:red"),
        ("holdout", "calibrated"): dict(marker="s", color="tab:red"),
    }
    for which, doc in records.items():
        done = [r for r in doc["rows"] if r["expressible"]]
        for model in ("sourced", "calibrated"):
            m = [r["measured_step_s"] for r in done]
            if model == "sourced":
                pr = [r["predicted_step_s"] for r in done]
            else:
                pr = [r["calibrated_ratio"] * r["measured_step_s"] for r in done]
            label = f"{which} rows, {model}" + (
                " (leave-one-out)" if model == "calibrated" and which == "given" else ""
            )
            ax.plot(m, pr, ls="none", ms=6, label=label, **styles[(which, model)])
        for r in done:
            ax.annotate(
                r["id"],
                (r["measured_step_s"], r["predicted_step_s"]),
                fontsize=6,
                xytext=(3, -7),
                textcoords="offset points",
                color="0.4",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step (s)")
    ax.set_ylabel("predicted step (s)")
    ax.set_title("published MaxText runs: predicted vs measured (grey: ±15 %)")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    path = pathlib.Path(out)
    fig.savefig(path, dpi=110, metadata=png_metadata("published runs: predicted vs measured"))
    plt.close(fig)
    return path


def markdown(doc: dict) -> str:
    """The docs table of a record: one row per run (what is missing where it is not expressed)."""
    lines = [
        "| row | hardware | model | measured s | predicted s | predicted / measured | "
        "calibrated / measured | fits (GiB) |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in doc["rows"]:
        run = r["published"]
        where = f"{run['devices']} {run['hw']}"
        if not r["expressible"]:
            lines.append(
                f"| {r['id']} | {where} | {run['model']} | {run['measured_step_s']} | — | "
                f"not expressible: {'; '.join(r['missing'])} | — | — |"
            )
            continue
        fits = "yes" if r["fits"] else "**no**"
        lines.append(
            f"| {r['id']} | {where} | {run['model']} | {r['measured_step_s']:.3f} | "
            f"{r['predicted_step_s']:.3f} | {r['ratio']:.2f} | {r['calibrated_ratio']:.2f}"
            f"{' (loo)' if r['calibrated_kind'] == 'leave-one-out' else ''} | {fits} "
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
        "",
        f"Calibrated ({s['calibration']}; loo: leave-one-out, the row's group refitted without "
        f"it; otherwise the file's factors applied): {s['calibrated_within_15_percent']} within "
        f"15 %, {s['calibrated_within_25_percent']} within 25 %, median |error| "
        f"{s['calibrated_median_abs_error']:.0%}, max {s['calibrated_max_abs_error']:.0%}; pairs "
        f"ordered as measured: {s['calibrated_pairs_ordered_right']} of "
        f"{s['pairs_expressible']}; bf16/fp8 pairs ordered as measured: sourced "
        f"{sum(p['sourced_order_right'] for p in s['precision_pairs'])}, calibrated "
        f"{sum(p['calibrated_order_right'] for p in s['precision_pairs'])} of "
        f"{len(s['precision_pairs'])}.",
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
    ap.add_argument(
        "--calibration",
        metavar="RATES.yaml",
        default=str(CALIBRATION),
        help="the calibration on the given rows (default: bench/results/calibrated_rates.yaml, "
        "written by `tierax calibrate --runs bench/data/calibration_runs.yaml --by platform`): "
        "its fitted rows get its leave-one-out prediction (refitted here), the others its factors",
    )
    ap.add_argument(
        "--write-runs",
        metavar="RUNS.yaml",
        help="write the expressible rows of --data as a runs file for `tierax calibrate --runs` "
        "and exit (nothing is predicted)",
    )
    ap.add_argument(
        "--plot",
        metavar="OUT.png",
        help="draw predicted vs measured from the two committed records (sourced and calibrated, "
        "given and holdout rows, the ±15 %% band) and exit",
    )
    args = ap.parse_args(argv)
    if args.plot:
        print(f"wrote {plot(args.plot)}")
        return 0
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
    if args.write_runs:
        return write_runs(data, args.write_runs, args.data)
    from tierax.costmodel import calibrated as calibrated_lib

    try:
        cal = calibrated_lib.load(args.calibration)
    except TieraxError as e:
        ap.error(str(e))
    launch.start()

    from rich.console import Console
    from rich.table import Table

    have = available()
    rows = []
    prepared: list = []
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
        row |= predict(
            spec,
            run["hw"],
            run["batch"],
            run["seq"],
            spec["remat"],
            run["id"],
            cal,
            prepared,
            run["measured_step_s"],
        )
        row["ratio"] = row["predicted_step_s"] / run["measured_step_s"]
        rows.append(row)
    calibrated_columns(rows, prepared, cal)
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
            label: predict(spec, spec["hw"], spec["microbatch"], spec["seq"], remat, pub["id"], cal)
            for label, remat in spec["plans"].items()
        }
        fastest = min(preds, key=lambda k: preds[k]["predicted_step_s"])
        calibrated_fastest = min(preds, key=lambda k: preds[k]["calibrated_step_s"])
        entry |= {
            "expressible": True,
            "predictions": preds,
            "measured_better": spec["better"],
            "predicted_better": fastest,
            "order_right": fastest == spec["better"],
            "calibrated_better": calibrated_fastest,
            "calibrated_order_right": calibrated_fastest == spec["better"],
        }
        pairs.append(entry)

    done = [r for r in rows if r["expressible"]]
    errors = [abs(r["ratio"] - 1) for r in done]
    cal_errors = [abs(r["calibrated_ratio"] - 1) for r in done]
    precision = precision_pairs(rows)
    summary = {
        "rows": len(rows),
        "expressible": len(done),
        "within_15_percent": sum(e <= WITHIN for e in errors),
        "median_abs_error": statistics.median(errors) if errors else None,
        "max_abs_error": max(errors) if errors else None,
        "all_predicted_to_fit": all(r["fits"] for r in done),
        "pairs_expressible": sum(p["expressible"] for p in pairs),
        "pairs_ordered_right": sum(p.get("order_right", False) for p in pairs),
        "calibration": _shown(args.calibration),
        "calibrated_loo_rows": sum(r["calibrated_kind"] == "leave-one-out" for r in done),
        "calibrated_within_15_percent": sum(e <= WITHIN for e in cal_errors),
        "calibrated_within_25_percent": sum(e <= 0.25 for e in cal_errors),
        "calibrated_median_abs_error": statistics.median(cal_errors) if cal_errors else None,
        "calibrated_max_abs_error": max(cal_errors) if cal_errors else None,
        "calibrated_pairs_ordered_right": sum(
            p.get("calibrated_order_right", False) for p in pairs
        ),
        "precision_pairs": precision,
        "goal": f"every expressible row within {WITHIN:.0%}, median ≤ {MEDIAN:.0%}, every "
        "row predicted to fit, every pair ordered as measured",
    }
    doc = _common.envelope("tierax.published_runs/1", argv) | {
        "data": str(pathlib.Path(args.data).resolve().relative_to(_common.ROOT))
        if pathlib.Path(args.data).resolve().is_relative_to(_common.ROOT)
        else str(args.data),
        "note": "cost-model predictions (simulate, schedule lhs) beside measured MaxText step "
        "times: sourced (no rate fitted to them) and calibrated (the calibration file's factors; "
        "for a row it was fitted on, the factors fitted without that row); nothing compiled; no "
        "GPU or TPU ran",
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
                r["id"],
                f"{run['devices']} {run['hw']}",
                run["model"],
                f"{run['measured_step_s']}",
                "—",
                "not expressible: " + "; ".join(r["missing"]),
                "—",
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
