"""The docs page and plot of a ``bench/tpu_check.py`` record (``python bench/tpu_check.py --render
RECORD``): every figure on the page is read from the record."""

from __future__ import annotations

import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results" / "tpu-check.md"
PLOT = ROOT / "docs" / "results" / "tpu-check.png"
GIB = 2**30


def _ms(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:,.0f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:+.1%}"


def rows(doc: dict) -> list[dict]:
    """One row per (model, microbatch, plan) of the record's cases."""
    out = []
    for case in doc.get("cases", []):
        for p in case.get("plans", []):
            out.append(
                {"model": case["model"], "microbatch": case["microbatch"], **p}
                | {"record": case.get("record", 1)}
            )
    return out


def _rates_lines(doc: dict) -> list[str]:
    cal = doc.get("calibration") or {}
    if not cal:
        return ["No rates were measured in this run: " + doc.get("calibration_error", "")[-300:]]
    lines = [
        "| rate | measured on the chip |",
        "|---|---|",
        f"| bf16 GEMMs at a step's shapes | {cal['matmul_flops_per_s_bfloat16'] / 1e12:.1f} "
        "TFLOP/s |",
    ]
    for d, r in cal.get("matmul_size_rates_bfloat16", [])[:-1]:
        lines.append(f"| bf16 GEMMs, smallest dimension {d} | {r / 1e12:.1f} TFLOP/s |")
    for seq, d, f, b in cal.get("splash_attention", []):
        lines.append(
            f"| splash kernel, seq {seq}, head dim {d} | forward {f / 1e12:.1f}, backward "
            f"{b / 1e12:.1f} TFLOP/s |"
        )
    if "memory_bytes_per_s" in cal:
        lines.append(f"| a layer's non-matmul work | {cal['memory_bytes_per_s'] / 1e9:.0f} GB/s |")
    link = (cal.get("microbenchmarks") or {}).get("host_link") or {}
    how = " beside compute" if link.get("rate_from") == "beside compute" else ""
    for way in ("d2h", "h2d"):
        r = link.get(f"{way}_bytes_per_s")
        lines.append(
            f"| host link {way.upper()} through the step's offload path{how} | "
            + (f"{r / 1e9:.2f} GB/s |" if r else "not resolved (copy time ≤ 0) |")
        )
    return lines


def _link_text(link: dict | None) -> str:
    if not link:
        return "not measured."
    if "beside_compute" in link:  # calibrate's host link: beside compute, the round trip beside it
        beside, trip = link["beside_compute"], link["round_trip"]
        sizes = ", ".join(f"{r['layer_bytes'] / 2**20:g}" for r in beside["rows"])
        if link["rate_from"] == "beside compute":
            head = (
                f"{link['d2h_bytes_per_s'] / 1e9:.2f} GB/s each way beside compute (the slope of "
                f"the time offloading adds over the bytes moved, {sizes} MiB a layer under a "
                "matmul scan)"
            )
        else:
            head = "beside compute not resolved (no added time grew with the bytes)"
        return f"{head}; the round trip (used where the slope is not resolved): " + _link_text(trip)
    if "round_trip_s" in link and not link.get("d2h_bytes_per_s"):
        return "not resolved (the copies took no measurable time: offloading is a no-op off a TPU)."
    if "round_trip_s" in link:
        return (
            f"{link['d2h_bytes_per_s'] / 1e9:.2f} GB/s each way, the round trip of "
            f"{link['bytes_each_way'] / GIB:.2f} GiB through a forward and backward."
        )
    d2h = link.get("d2h_bytes_per_s")
    return (
        f"D2H {d2h / 1e9:.2f} GB/s from a forward alone returning its host residuals from jit (a "
        "slower path than the step's own copies, which the round trip replaced)."
        if d2h
        else "not resolved."
    )


def _compiled_text(r: dict) -> str:
    """The compiled step (the model's with XLA's own recompute and the loads its schedule exposes
    beyond the model's) and its error, where --checked compiled the plan; else a dash."""
    c = r.get("compiled") or {}
    if "compiled_step_s" not in c:
        return "—" if not c else "refused"
    return f"{_ms(c['compiled_step_s'])} ({_pct(r.get('time_error_compiled'))})"


def table(doc: dict) -> list[str]:
    lines = [
        "| record | model | mb | plan | measured ms | predicted ms (calibrated / datasheet) | "
        "error (cal / ds) | compiled step ms (error) | fit predicted → chip | host GiB "
        "predicted / compiled |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows(doc):
        pc, pu = r["predicted_calibrated"], r["predicted_uncalibrated"]
        chip = "ran" if r.get("ran") else ("refused (OOM)" if r.get("out_of_memory") else "failed")
        host = (
            f"{pc['host_bytes'] / GIB:.2f} / {r['host_bytes_compiled'] / GIB:.2f}"
            if r.get("ran") and (pc["host_bytes"] or r.get("host_bytes_compiled"))
            else "—"
        )
        lines.append(
            f"| {r['record']} | {r['model']} | {r['microbatch']} | {r['plan']} | "
            f"{_ms(r.get('step_time_s'))} | "
            f"{_ms(pc['step_time_s'])} / {_ms(pu['step_time_s'])} | "
            f"{_pct(r.get('time_error_calibrated'))} / {_pct(r.get('time_error_uncalibrated'))} | "
            f"{_compiled_text(r)} | {'fits' if pc['fits'] else 'no'} → {chip} | {host} |"
        )
    return lines


def summary(doc: dict) -> list[str]:
    lines = [
        "| record | model | mb | measured fastest | planner (calibrated) vs fastest | planner "
        "(datasheet) vs fastest | `plan --check` vs fastest | worst time error (cal / ds / "
        "compiled) | fit verdicts right |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in doc.get("cases", []):
        s = case.get("summary")
        if not s:
            lines.append(
                f"| {case.get('record', 1)} | {case['model']} | {case['microbatch']} | "
                "error | | | | | |"
            )
            continue
        chose = case.get("planner_chose", {})
        lines.append(
            f"| {case.get('record', 1)} | {case['model']} | {case['microbatch']} | "
            f"{s.get('measured_fastest', '—')} | "
            f"{chose.get('calibrated', '—')} {_pct(s.get('planner_calibrated_vs_fastest'))} | "
            f"{chose.get('uncalibrated', '—')} {_pct(s.get('planner_uncalibrated_vs_fastest'))} | "
            + (
                f"{chose['checked']} {_pct(s.get('planner_checked_vs_fastest'))} | "
                if "checked" in chose
                else "— | "
            )
            + f"{_pct(s.get('worst_time_error_calibrated'))} / "
            f"{_pct(s.get('worst_time_error_uncalibrated'))} / "
            f"{_pct(s.get('worst_time_error_compiled'))} | {s.get('fit_verdicts_right')} |"
        )
    return lines


def plot(doc: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in rows(doc) if r.get("ran")]
    fig, ax = plt.subplots(figsize=(6.5, 6))
    marks = {"dense": "o", "moe": "s", "mla-moe": "^", "dense-8k": "v", "dense-hd64": "<"}
    models = list(dict.fromkeys(r["model"] for r in ran))
    for label, color in (("calibrated", "tab:blue"), ("uncalibrated", "tab:orange")):
        for model in models:
            m = marks.get(model, "D")
            pts = [r for r in ran if r["model"] == model]
            if pts:
                ax.scatter(
                    [r["step_time_s"] * 1e3 for r in pts],
                    [r[f"predicted_{label}"]["step_time_s"] * 1e3 for r in pts],
                    marker=m,
                    color=color,
                    alpha=0.8,
                    label=f"{model}, {'measured rates' if label == 'calibrated' else 'datasheet'}",
                )
    compiled = [r for r in ran if "compiled_step_s" in (r.get("compiled") or {})]
    if compiled:
        ax.scatter(
            [r["step_time_s"] * 1e3 for r in compiled],
            [r["compiled"]["compiled_step_s"] * 1e3 for r in compiled],
            marker="x",
            color="tab:green",
            label="compiled step (plan --check's: XLA's recompute, loads)",
        )
    if ran:
        hi = (
            max(max(r["step_time_s"], r["predicted_calibrated"]["step_time_s"]) for r in ran)
            * 1.1e3
        )
        lo = min(r["step_time_s"] for r in ran) * 0.9e3
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="k", alpha=0.07)
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("measured step (ms), TPU v5e")
    ax.set_ylabel("predicted step (ms)")
    ax.set_title("tierax's time model on one TPU v5e chip (band: ±10 %)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _rel(record: pathlib.Path):
    r = record.resolve()
    return r.relative_to(ROOT) if r.is_relative_to(ROOT) else record


def render(records, page: pathlib.Path = PAGE, png: pathlib.Path = PLOT) -> list:
    """The page and plot from one or more records (``records``: a path or a list of paths); the
    first record's rates table is shown, every record's cases."""
    records = [records] if isinstance(records, (str, pathlib.Path)) else list(records)
    docs = [json.loads(pathlib.Path(r).read_text()) for r in records]
    doc = dict(docs[-1])
    doc["cases"] = [c | {"record": i + 1} for i, d in enumerate(docs) for c in d.get("cases", [])]
    doc["skipped"] = [
        f"record {i + 1}: {s}" for i, d in enumerate(docs) for s in d.get("skipped", [])
    ]
    rels = " ".join(str(_rel(pathlib.Path(r))) for r in records)
    made = [
        f"- `{_rel(pathlib.Path(r))}`: `{d['command']}` on {d['machine']['device_count']} × "
        f"{d['machine']['device_kind']} ({d['machine']['platform']}), jax {d['jax_version']}, "
        f"{d['created']}; rates: {d['calibration'].get('rates_from', 'measured in this run')}"
        + (
            f"; the planner kept {d['fit_margin']['margin']:.1%} of the chip's limit free "
            f"({d['fit_margin']['source']})"
            if d.get("fit_margin", {}).get("margin")
            else ""
        )
        for r, d in zip(records, docs, strict=True)
    ]
    lines = [
        "# tierax on one TPU v5e chip",
        "",
        f"Written by `python bench/tpu_check.py --render {rels}` from these records:",
        "",
        *made,
        "",
        "Predictions are `tierax simulate --target v5e` for the same model, microbatch and plan: "
        "*calibrated* with the rates this run measured on the chip first (below), *datasheet* with "
        "tierax's v5e rates as they stood when the record was made, no calibration (in records "
        "1-12 the datasheet's; in 13-17 the measured kernel-rate table, "
        "docs/results/tpu-kernel-rates.md, tierax's v5e default after record 12).  Every plan ran "
        "alone on the chip (its state freed before the next); a plan the chip's compiler or "
        "runtime refused is shown as refused.  The records in order: the first run, the second "
        "(the planner's MLP offload stored in its own layer), every offloaded value stored a layer "
        "later, the fourth (values made before the attention stored in their own layer, the rest a "
        "layer later: docs/concepts/mechanisms.md), the fifth (each store hidden only under its "
        "own window; gathers and scatters priced), the sixth (the planner within XLA:TPU's "
        "scheduler limit), the seventh (the dense shape at seq 8192 and at head dim 64), the "
        "eighth (the fit boundary alone), the ninth (the reference step alone, the gradient norm "
        "fused into Adam's pass on a TPU: tierax.train.step.global_norm), the tenth (the dense "
        "shapes again, RoPE in its TPU form: docs/guide/tpu.md), the eleventh (the MoE shapes and "
        "the fit boundary after both, a preset recomputing what it would offload in a one-layer "
        "group: docs/concepts/plans.md), the twelfth (the host link measured beside compute), the "
        "thirteenth and fourteenth (every case of the check's goals: seq 8192 with splash, head "
        "dims 64 and 128, the MoE shapes, predicted by the kernel-rate table as the default), "
        "the fifteenth (the MLA + MoE shapes once a one-layer group's remat recomputes: "
        "tierax.models.decoder.single_trip; before it XLA:TPU merged the dense layer's "
        "recomputation into its forward), the sixteenth (the dense shapes and the fit "
        "boundary once a layer backward that recomputes splash attention holds the kernel's "
        "float32 log-sum-exp buffer, 128 lanes wide: tierax.models.attention.SPLASH_LSE_LANES) "
        "the seventeenth (the dense shapes with the planner's plans from `tierax plan "
        "--check`, which on a TPU target re-plans below a plan whose loads XLA:TPU's schedule "
        "leaves waiting: tierax.solving.plan_check; --planned-from names the files), the "
        "eighteenth and nineteenth (--checked: the dense shape at microbatches 32 and 40, which "
        "fit only with training state on the host; `plan --check` run on the chip chose the plan, "
        "each plan compiled on the chip gives its compiled step: the model's with XLA's own "
        "recompute and the loads its schedule exposes beyond the model's), the twentieth "
        "(--checked on the MoE and MLA + MoE shapes at microbatch 8, the seventeenth's rates as "
        "recorded) and the twenty-first (the MoE case again once `plan --check` keeps to "
        "XLA:TPU's scheduler share less the miss a compile measured: "
        "tierax.solving.plan_check.corrected_rates; that run's log was cut off by the call's time "
        "limit, and its record predates the check's compiles being recorded).",
        "",
        "What the platform choice, the memory figures and the back-to-back timing follow was read "
        "first from `bench/investigations/tpu_probe.py` on the same chip (its record: "
        "`bench/results/tpu_probe.json`).",
        "",
        "## Rates measured on the chip",
        "",
        *_rates_lines(docs[-1]),
        "",
        *[
            f"Record {i + 1}'s host link: "
            + _link_text((d.get("calibration") or {}).get("microbenchmarks", {}).get("host_link"))
            for i, d in enumerate(docs)
        ],
        "",
        "## Each case",
        "",
        *summary(doc),
        "",
        "![predicted against measured step time](tpu-check.png)",
        "",
        "## Each plan",
        "",
        *table(doc),
        "",
    ]
    refs = [(i + 1, d["reference"]) for i, d in enumerate(docs) if d.get("reference")]
    if refs:
        lines += ["## tierax beside a pure-JAX step", ""]
        for i, ref in refs:
            lines.append(
                f"- record {i}: `bench/reference_step.py` at d_model {ref['shape']['d_model']}, "
                f"{ref['shape']['layers']} layers, batch {ref['shape']['batch']} × seq "
                f"{ref['shape']['seq']}, remat full, bf16: {_ms(ref.get('reference_step_s'))} ms; "
                f"tierax's remat-full step at the same shape: {_ms(ref.get('tierax_step_s'))} ms "
                f"(ratio {ref.get('tierax_over_reference', float('nan')):.3f})."
            )
        lines.append("")
    bounds = [(i + 1, d["boundary"]) for i, d in enumerate(docs) if d.get("boundary")]
    if bounds:
        lines += ["## The fit boundary on the chip", ""]
        for i, b in bounds:
            if "error" in b:
                lines.append(f"- record {i}: the probe failed ({b['error'].splitlines()[-1]})")
                continue
            chip = b["on_chip"]
            said = "; ".join(
                f"{label}: "
                + ", ".join(f"{mb} {'fits' if ok else 'does not fit'}" for mb, ok in fits)
                for label, fits in b["predicted_fits"].items()
            )
            lines.append(
                f"- record {i}: {b['plan']} at seq {b['seq']} on the chip: microbatch "
                f"{chip['microbatch']} fits, {chip['refused_at']} refused (probes: "
                + ", ".join(
                    f"{p['microbatch']} {'ran' if p['fits'] else 'refused'}" for p in chip["probes"]
                )
                + f"); predicted: {said}."
            )
        lines.append("")
    if doc.get("skipped"):
        lines += ["## Not run", "", *[f"- {s}" for s in doc["skipped"]], ""]
    page.write_text("\n".join(lines))
    plot(doc, png)
    return [page, png]
