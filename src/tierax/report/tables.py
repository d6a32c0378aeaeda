"""Rich tables for CLI output."""

from __future__ import annotations

from rich.table import Table


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def bench_table(
    records, peak_flops: float, title: str, *, not_run=(), datasheet: float | None = None
) -> Table:
    """A bench record's plans: those that ran, then those the device refused (``not_run``).  MFU is
    against the ``datasheet`` peak where given, else the measured one (``peak_flops``)."""
    basis = (
        f"the datasheet peak of {datasheet / 1e12:.0f} TFLOP/s per device (measured GEMM rate at "
        f"the step's shapes: {peak_flops / 1e12:.1f})"
        if datasheet
        else f"the measured local peak of {peak_flops / 1e12:.3f} TFLOP/s per device"
    )
    t = Table(
        title=title,
        caption=f"MFU against {basis}; peak/dev: rt = allocator (runtime), xla = compiled memory "
        "analysis",
    )
    for col in (
        "plan",
        "step ms",
        "tokens/s",
        "TFLOP/s/dev",
        "MFU",
        "peak/dev",
        "compiled temp",
        "act. device",
        "act. host",
        "act. remat",
        "loss",
    ):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for r in records:
        t.add_row(
            r["plan"],
            f"{r['step_time_s'] * 1e3:.1f}",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['tflops_per_device']:.4f}",
            f"{r['mfu']:.1%}",
            _peak_cell(r),
            fmt_bytes(r["compiled_temp_bytes"]),
            fmt_bytes(r["device_activation_bytes"]),
            fmt_bytes(r["host_activation_bytes"]),
            fmt_bytes(r["remat_activation_bytes"]),
            f"{r['loss']:.4f}",
        )
    for n in not_run:
        why = "does not fit" if n["out_of_memory"] else "failed"
        t.add_row(n["plan"], f"{why} ({n['stage']})", *["—"] * 9)
    return t


def _peak_cell(r) -> str:
    """Runtime peak (allocator) where measured — '≤' when only an upper bound — else XLA's compiled
    peak."""
    if r.get("peak_device_bytes_runtime") is not None:
        return (
            ("" if r.get("runtime_peak_exact") else "≤ ")
            + fmt_bytes(r["peak_device_bytes_runtime"])
            + " rt"
        )
    compiled = r.get("peak_device_bytes_compiled") or 0
    return fmt_bytes(compiled) + " xla" if compiled else "—"


def models_table(configs) -> Table:
    t = Table(title="named model configs")
    for col in ("name", "family", "layers", "d_model", "params", "activated"):
        t.add_column(col, justify="left" if col in ("name", "family") else "right")
    for cfg in configs:
        t.add_row(
            cfg.name,
            cfg.family,
            str(cfg.num_layers),
            str(cfg.d_model),
            count_text(cfg.param_count()),
            count_text(cfg.activated_param_count()),
        )
    return t


def count_text(n: float) -> str:
    """A parameter count readable at every size: 8.030 B, 12.5 M, 180.8 K."""
    if n >= 1e9:
        return f"{n / 1e9:.3f} B"
    if n >= 1e6:
        return f"{n / 1e6:.1f} M"
    return f"{n / 1e3:.1f} K"


def plan_table(placements: dict, title: str) -> Table:
    t = Table(title=title)
    t.add_column("group")
    t.add_column("activation")
    t.add_column("placement")
    colour = {"device": "green", "offload": "cyan", "remat": "yellow"}
    for g, names in placements.items():
        for n, p in names.items():
            t.add_row(g, n, f"[{colour[p.value]}]{p.value}[/]")
    return t


def compile_table(r) -> Table:
    tpu = r.target in _tpu_keys()
    t = Table(
        title=f"{r.model} · plan {r.plan} · {r.target} × {r.devices} · microbatch "
        f"{r.microbatch}/device × seq {r.seq} · xla preset {r.xla_preset}",
        caption=(
            f"XLA:TPU compile on the attached {r.compiled_on}"
            if r.compiled_on
            else f"deviceless XLA:{'TPU' if tpu else 'GPU'} compile (no autotuning: sizes close, "
            "not exact)"
        )
        + f"; attention {r.attention}; "
        + "; ".join(r.notes),
    )
    t.add_column("figure")
    t.add_column("per device", justify="right")

    def size(n) -> str:  # None: XLA refused the program, so it has no such figure
        return "—" if n is None else fmt_bytes(n)

    limit = "XLA:TPU's HBM limit" if tpu else "capacity − runtime reserve"
    rows = [("XLA refused the program", f"[red]{r.xla_error}[/]")] if r.out_of_memory else []
    rows += [
        ("arguments", size(r.device_argument_bytes)),
        ("outputs", size(r.device_output_bytes)),
        ("aliased (donated)", size(r.device_alias_bytes)),
        ("temp", size(r.device_temp_bytes)),
        (
            "device peak" + (" (XLA's stated need)" if r.out_of_memory else ""),
            size(r.device_peak_bytes),
        ),
        ("device capacity", fmt_bytes(r.device_capacity_bytes)),
        (
            f"fits (≤ {limit}, {size(r.device_limit_bytes)})",
            "[green]yes[/]" if r.fits else "[red]no[/]",
        ),
        ("host temp (offloaded)", size(r.host_temp_bytes)),
    ]
    if r.predicted:
        rows.append(
            (
                "predicted peak (cost model)",
                f"{fmt_bytes(r.predicted['peak_device_bytes'])} ({r.predicted['peak_phase']})",
            )
        )
        if "step_time_s" in r.predicted:  # --rates: the calibrated step time, and its factors
            rows.append(
                (
                    f"predicted step (calibration: {r.predicted['calibration']})",
                    f"{r.predicted['step_time_s']:.4g} s",
                )
            )
    for o in r.offloaded:
        state = (
            fmt_bytes(o.host_bytes)
            if o.on_host
            else f"[red]not found[/] (expected {fmt_bytes(o.expected_bytes)})"
        )
        state += " (matched by size: XLA kept no name)" if o.matched_by == "size" else ""
        rows.append((f"  offloaded {o.group}/{o.name}", state))
    ov = r.overlap
    if ov:  # none when XLA refused the program
        rows += [
            ("host transfers per step", str(ov["transfers"])),
            ("transfer bytes", fmt_bytes(ov["transfer_bytes"])),
            (
                "est. transfer time (link busy: hidden + exposed)",
                f"{ov['est_transfer_s'] * 1e3:.3f} ms",
            ),
            ("  est. hidden under compute", f"{ov['est_hidden_s'] * 1e3:.3f} ms"),
            ("  est. exposed (the stream waits)", f"{ov['est_exposed_s'] * 1e3:.3f} ms"),
        ]
    if r.predicted.get("compiled_step_s"):
        rows.append(
            (
                "predicted step: the model · with what XLA's program adds (its own recompute, "
                "loads exposed beyond the model)",
                f"{r.predicted['model_step_s'] * 1e3:.1f} ms · "
                f"{r.predicted['compiled_step_s'] * 1e3:.1f} ms",
            )
        )
    rc = r.xla_recompute
    if rc:  # none when XLA refused the program
        rows.append(
            (
                "XLA's own recompute (rematerialization pass)",
                f"{rc['instructions']} instruction(s), est. {rc['est_s'] * 1e3:.3f} ms"
                if rc["instructions"]
                else "none",
            )
        )
    rows.append(("compile time", f"{r.compile_time_s:.1f} s"))
    for k, v in rows:
        t.add_row(k, v)
    return t


def inventory_table(inv, cfg) -> Table:
    """``cfg`` None: an inventory of another program (MaxText's), titled by ``inv.model``."""
    t = Table(
        title=f"{cfg.name if cfg is not None else inv.model} · microbatch {inv.microbatch}/device "
        f"× seq {inv.seq} · mesh "
        + ",".join(f"{a}={v}" for a, v in inv.mesh.items())
        + " · per device",
        caption=(
            f"parameters {fmt_bytes(inv.param_bytes)}, gradients {fmt_bytes(inv.grad_bytes)}, "
            f"{'AdamW' if cfg is not None else 'optimizer'} state "
            f"{fmt_bytes(inv.optimizer_bytes)}, logits {fmt_bytes(inv.logits_bytes)} per device"
            + (f"; attention: {cfg.attention}" if cfg is not None else "")
        ),
    )
    for col in ("group", "activation", "per layer", "layers", "total", "remat GFLOP/layer"):
        t.add_column(col, justify="left" if col in ("group", "activation") else "right")
    for g in inv.groups:
        for a in g.activations:
            t.add_row(
                g.name,
                a.name,
                fmt_bytes(a.bytes_per_layer),
                str(a.num_layers),
                fmt_bytes(a.total_bytes),
                f"{a.recompute_flops_per_layer / 1e9:.3g}",
            )
        t.add_row(
            g.name,
            "[dim](unnamed, any remat)[/]",
            "",
            "",
            "",
            f"{g.base_recompute_flops_per_layer / 1e9:.3g}",
        )
        t.add_row(
            g.name,
            "[dim](everything, no remat)[/]",
            fmt_bytes(g.save_all_bytes_per_layer),
            str(g.num_layers),
            fmt_bytes(g.save_all_bytes_per_layer * g.num_layers),
            "",
        )
    return t


def _peak_rows(pred) -> list[tuple[str, str]]:
    """The peak, the phase it is in and the rows that make it (they sum to it); the other phases'
    totals beside it (each as the peak counts it: offloaded state freed)."""
    from tierax.costmodel.prediction import peak_rows, phase_text

    b = pred.breakdown
    phase = b.peak_phase
    rows = [
        (
            f"peak device ({phase_text(b)}), made of",
            f"{fmt_bytes(pred.peak_device_bytes)} of {fmt_bytes(pred.device_capacity_bytes)}",
        ),
        *((f"  {label}", fmt_bytes(n)) for label, n in peak_rows(b)),
    ]
    others = []
    if phase != "layer backward":
        others.append(f"a layer backward peaks at {fmt_bytes(b.layer_phase_bytes)}")
    if phase != "loss":
        others.append(f"the loss at {fmt_bytes(b.loss_phase_bytes)}")
    if phase not in ("update", "accumulation") and b.update_phase_bytes and b.state.freed_bytes:
        others.append(f"the streamed update at {fmt_bytes(b.update_phase_bytes)}")
    if phase != "accumulation" and b.accumulation_phase_bytes:
        others.append(f"the accumulation at {fmt_bytes(b.accumulation_phase_bytes)}")
    not_in = (
        f"one layer's workspace {fmt_bytes(b.workspace_bytes)}"
        if phase == "loss"
        else f"logits and their gradients {fmt_bytes(b.logits_bytes)}"
        if phase == "layer backward"
        else "a microbatch's activations, workspace and logits"
    )
    rows.append((f"  not in the peak: {not_in}", ", ".join(others)))
    if b.reported_excess_bytes:
        rows.append(
            (
                "  fits by XLA:TPU's assigned peak: the peak less what this libtpu reports beyond"
                f" its assignment ({fmt_bytes(b.reported_excess_bytes)})",
                fmt_bytes(b.assigned_peak_bytes),
            )
        )
    return rows


def prediction_table(pred, title: str) -> Table:
    from tierax.costmodel.rates import PEAK_UNDERPREDICTION_TPU  # JAX: `tierax plans` imports none

    b = pred.breakdown
    t = Table(title=title, caption="rates: " + "; ".join(f"{k}: {v}" for k, v in b.rates.items()))
    t.add_column("figure")
    t.add_column("per device", justify="right")
    ms = lambda s: f"{s * 1e3:.3f} ms"  # noqa: E731
    rows = [
        (
            f"fits (≤ {b.fit_limit} {fmt_bytes(b.fit_limit_bytes)})",
            "[green]yes[/]" if pred.fits else "[red]no[/]",
        ),
        *(
            [
                (
                    f"  above XLA:TPU's scheduler limit {fmt_bytes(lim)}"
                    + (
                        ""
                        if pred.peak_device_bytes > lim
                        else f" with the {fmt_bytes(b.state.host_bytes)} of training state on "
                        "the host"
                    )
                    + ": XLA:TPU may rematerialise on its own, which the step time does not "
                    "price (tierax compile and plan --check price it)",
                    "[yellow]step time a lower bound[/]",
                )
            ]
            if pred.xla_may_rematerialize and (lim := b.scheduler_limit_bytes)
            else []
        ),
        *(
            [
                (
                    f"  within the model's largest peak under-prediction on the chip "
                    f"({PEAK_UNDERPREDICTION_TPU:.1%}) of the limit: XLA:TPU may refuse it",
                    "[yellow]fit uncertain[/]",
                )
            ]
            if b.scheduler_limit_bytes
            and pred.fits
            and b.assigned_peak_bytes * (1 + PEAK_UNDERPREDICTION_TPU) > b.fit_limit_bytes
            else []
        ),
        *_peak_rows(pred),
        ("host (offloaded)", fmt_bytes(pred.host_bytes)),
        *(
            [("  of which training state", fmt_bytes(b.state.host_bytes))]
            if b.state.host_bytes
            else []
        ),
        ("step time", ms(pred.step_time_s)),
        *(
            [
                (
                    f"  {b.grad_accum} microbatches (each: the rows below, less the update)",
                    f"{b.grad_accum} × {ms(b.microbatch_s)}",
                ),
                (
                    "  the update once + the gradient accumulator's additions",
                    f"{ms(b.update_hbm_s)} + {ms(b.accumulate_s)}",
                ),
            ]
            if b.grad_accum > 1
            else []
        ),
        ("  compute", ms(b.compute_s)),
        ("    of which non-matmul work at memory bandwidth", ms(b.hbm_s)),
        ("  recompute", ms(b.recompute_s)),
        (  # the copies' time at the link, most of it hidden under compute: not the step's
            "  host transfers at the link (of which exposed: d2h / h2d)",
            f"{ms(b.transfer_s)} (exposed {ms(b.exposed_d2h_s)} / {ms(b.exposed_h2d_s)})",
        ),
        *(
            [
                (
                    "    loads not overlapped: the peak is above XLA:TPU's scheduler limit",
                    "all exposed",
                )
            ]
            if b.copies_serialized
            else []
        ),
        *(
            [
                (
                    "  streamed state update copies (exposed)"
                    if not b.state.accum_host_bytes
                    else "  training-state copies: update and accumulator (exposed)",
                    f"{ms(b.state.transfer_s)} ({ms(b.state.exposed_s)})",
                )
            ]
            if b.state.transfer_s
            else []
        ),
        (
            "  collectives (of which exposed)",
            f"{ms(b.collective_s)} (exposed {ms(b.exposed_collective_s)})",
        ),
        *(
            [("  first write of fresh memory (CPU)", ms(b.first_touch_s))]
            if b.first_touch_s
            else []
        ),
        *([("  XLA:CPU's transposing fusions (CPU)", ms(b.transpose_s))] if b.transpose_s else []),
        ("TFLOP/s/device (model FLOPs)", f"{pred.tflops_per_device:.1f}"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def explain_table(result, title: str) -> Table:
    t = Table(
        title=title,
        caption=f"device budget {fmt_bytes(result.budget_bytes)}"
        + (
            f" (planned within XLA:TPU's scheduler limit {fmt_bytes(within)}: above it the "
            "compiler serialises host loads and rematerialises on its own)"
            if (within := result.planned_within_bytes) and within < result.budget_bytes
            else ""
        )
        + f", host budget {fmt_bytes(result.host_budget_bytes)}",
    )
    for col in (
        "group",
        "activation",
        "bytes",
        "remat ms",
        "transfer ms",
        "hidden",
        "choice",
        "why",
    ):
        t.add_column(
            col,
            justify="right" if col in ("bytes", "remat ms", "transfer ms", "hidden") else "left",
        )
    colour = {"device": "green", "offload": "cyan", "remat": "yellow"}
    for e in result.explain:
        t.add_row(
            e.group,
            e.name,
            fmt_bytes(e.bytes),
            f"{e.recompute_s * 1e3:.3g}",
            "—" if e.transfer_s is None else f"{e.transfer_s * 1e3:.3g}",
            "—" if e.hidden_fraction is None else f"{e.hidden_fraction:.0%}",
            f"[{colour[e.choice]}]{e.choice}[/]",
            e.why,
        )
    return t


def _tpu_keys() -> set[str]:
    from tierax.hardware import TPU_TARGETS

    return set(TPU_TARGETS)


def sweep_table(points, key: str, title: str, references=()) -> Table:
    """One row per swept value: the planner's prediction, the reference presets, what changed in the
    plan."""
    t = Table(
        title=title,
        caption="cost-model predictions; references fit only where marked with a number",
    )
    for col in (
        key,
        "fits",
        "TFLOP/s/dev",
        "step s",
        "peak GiB",
        "host GiB",
        *references,
        "plan change",
    ):
        t.add_column(col, justify="left" if col == "plan change" else "right")
    for p in points:
        ref = [
            f"{v:.1f}" if v is not None else "—"
            for v in (p["reference"].get(r) for r in references)
        ]
        if not p["fits"]:
            t.add_row(f"{p['value']:g}", "no", "—", "—", "—", "—", *ref, "no plan fits")
            continue
        t.add_row(
            f"{p['value']:g}",
            "yes",
            f"{p['tflops_per_device']:.1f}",
            f"{p['step_time_s']:.4g}",  # a small model's step is a few ms: not "0.000"
            f"{p['peak_device_bytes'] / 2**30:.1f}",
            f"{p['host_bytes'] / 2**30:.1f}",
            *ref,
            "; ".join(p["changed"]) or "",
        )
    return t


def _gemms(m: dict) -> str:
    if not m.get("gemms"):
        return m.get("shape", "")
    shapes = sorted({"×".join(map(str, g["shape"])) for g in m["gemms"]})
    return ", ".join(shapes) + " as " + "/".join(dict.fromkeys(g["role"] for g in m["gemms"]))


def calibration_table(entry: dict) -> Table:
    """What ``tierax calibrate`` measured and stored (a row per rate the cost model reads)."""
    t = Table(
        title=f"calibration of {entry.get('target', '?')} ({entry.get('device_kind', '?')}), "
        f"{entry.get('created', '?')}",
        caption=f"stored in {entry.get('file', '?')}",
    )
    t.add_column("rate")
    t.add_column("measured", justify="right")
    t.add_column("microbenchmark")
    micro = entry.get("microbenchmarks", {})
    for dtype in ("float32", "bfloat16"):
        rate = entry[f"matmul_flops_per_s_{dtype}"]
        gemms = _gemms(micro.get(f"matmul_{dtype}", {}))
        t.add_row(f"matmul {dtype}", f"{rate / 1e12:.3f} TFLOP/s", gemms)
        by_size = micro.get(f"matmul_by_size_{dtype}", {})
        for dim, rate in entry.get(f"matmul_size_rates_{dtype}", [])[:-1]:  # the last: the mix
            t.add_row(
                f"matmul {dtype}, smallest dimension {dim}",
                f"{rate / 1e12:.3f} TFLOP/s",
                _gemms(by_size.get(str(dim), {})),
            )
        if f"head_matmul_flops_per_s_{dtype}" in entry:
            rate = entry[f"head_matmul_flops_per_s_{dtype}"]
            gemms = _gemms(micro.get(f"head_matmul_{dtype}", {}))
            t.add_row(
                f"LM head matmul {dtype}",
                f"{rate / 1e12:.3f} TFLOP/s",
                f"{gemms}, float32 products",
            )
    mem, nm = micro.get("memory", {}), micro.get("nonmatmul", {})
    size = f"{mem.get('bytes_per_array', 0) / 2**20:.0f} MiB arrays"
    what = ", ".join(f"{k} {v}" for k, v in nm.get("shape", {}).items())
    rate = entry["memory_bytes_per_s"]
    t.add_row(
        "non-matmul work (the model's bytes)",
        f"{rate / 1e9:.1f} GB/s",
        f"a norm, a gated activation, a softmax and their gradients: {what}",
    )
    if "stream_bytes_per_s" in entry:
        t.add_row(
            "streaming (reference)",
            f"{entry['stream_bytes_per_s'] / 1e9:.1f} GB/s",
            f"y ← a·x + y, y donated, {size}",
        )
    if "first_touch_bytes_per_s" in entry:
        rate = entry["first_touch_bytes_per_s"]
        t.add_row(
            "first touch of fresh memory",
            f"{rate / 1e9:.2f} GB/s",
            f"the same with a fresh output, minus the donated time, {size}",
        )
    tr = micro.get("transposed_fusion", {})
    for key, cls, what in (
        ("transpose_read_elems_per_s", "spread", "rows spread"),
        ("transpose_aliased_read_elems_per_s", "aliased", "rows a multiple of 4 KiB apart"),
    ):
        if key in entry:
            shape = "×".join(map(str, tr.get(cls, tr).get("shape", [])))
            t.add_row(
                f"XLA:CPU's slow transposing fusion, {what}",
                f"{entry[key] / 1e6:.0f} M elements/s",
                f"a backward loop's (a·g·(1 − u) + u)ᵀ of stacked g, u, {shape}, reads of its "
                "three inputs",
            )
    for seq, d, fwd, bwd in entry.get("splash_attention", []):
        t.add_row(
            f"splash attention, seq {seq}, head dim {d}",
            f"{fwd / 1e12:.1f} / {bwd / 1e12:.1f} TFLOP/s",
            "the Pallas kernel forward / backward, causal, the FLOPs the cost model counts",
        )
    link = micro.get("host_link") or {}
    how = (
        f"the step's prefetching layer scan storing and loading "
        f"{link['bytes_each_way'] / 2**30:.2f} GiB, against it keeping them: one rate both ways"
        if "round_trip_s" in link
        else "jax.device_put, 1 GiB"
    )
    for key, name in (
        ("d2h_bytes_per_s", "device → pinned host"),
        ("h2d_bytes_per_s", "pinned host → device"),
    ):
        if key in entry:
            t.add_row(name, f"{entry[key] / 1e9:.1f} GB/s", how)
    return t


def _mesh_text(m: dict) -> str:
    return ",".join(f"{a}={v}" for a, v in m.items() if v > 1) or "1 device"


def _link_cell(c: dict, group: str) -> str:
    s = c["collective_s"].get(group)
    if not s:
        return "—"
    link = c["links"].get(group, {})
    return f"{s:.2f}" + ("*" if link.get("crosses_domain") else "")


MESH_GROUPS = ("data", "fsdp×expert", "fsdp", "tensor", "expert")


def mesh_search_table(doc: dict, title: str) -> Table:
    """``tierax plan --mesh auto``'s ranked candidates (the search record's ``candidates``, top
    ``doc['top']``): per collective group its seconds per step (* crosses NVLink domains)."""
    t = Table(
        title=title,
        caption="collective seconds per optimizer step by group (* leaves the NVLink domain: "
        "scale-out rate); cost-model predictions",
    )
    for col in (
        "#",
        "mesh",
        "mb × accum",
        "tokens/s",
        "step s",
        *(f"{g} s" for g in MESH_GROUPS),
        "exposed coll s",
        "peak GiB",
        "host GiB",
    ):
        if col == "mesh":  # whole names: a cut mesh name reads as another mesh
            shown = doc["candidates"][: doc["top"]]
            widest = max((len(_mesh_text(c["mesh"])) for c in shown), default=4)
            t.add_column(col, justify="left", no_wrap=True, min_width=widest)
        else:
            t.add_column(col, justify="right")
    for i, c in enumerate(doc["candidates"][: doc["top"]], 1):
        if c["tokens_per_s"] is None:
            continue
        t.add_row(
            str(i),
            _mesh_text(c["mesh"]),
            f"{c['microbatch']} × {c['grad_accum']}",
            f"{c['tokens_per_s']:,.0f}",
            f"{c['step_time_s']:.2f}",
            *(_link_cell(c, g) for g in MESH_GROUPS),
            f"{c['exposed_collective_s']:.2f}",
            f"{c['peak_device_bytes'] / 2**30:.1f}",
            f"{c['host_bytes'] / 2**30:.1f}",
        )
    return t


def calibration_fit_table(fits, by: str) -> Table:
    """``tierax calibrate --runs``: per group its factors, and per run the measured step, the
    uncalibrated prediction's error, the leave-one-out error and the fitted error."""
    t = Table(
        title=f"calibration from measured runs, per {by}",
        caption="error: predicted / measured − 1; leave-one-out: the run predicted by the factors "
        "fitted on its group's other runs",
    )
    for col in ("group", "run", "measured s", "uncalibrated", "leave-one-out", "fitted"):
        t.add_column(col, justify="left" if col in ("group", "run") else "right")
    for g in fits:
        fs = g.factor_set()
        shown = ", ".join(f"{r} ×{v:.3f}" for r, v in g.factors.items())
        if g.clamped:
            shown += f" (at a bound: {', '.join(g.clamped)})"
        t.add_row(f"[bold]{g.key}[/]", shown, "", "", "", "")
        for name, e in fs.runs.items():
            t.add_row(
                "",
                name,
                f"{e.measured_s:.4g}",
                f"{e.error('uncalibrated'):+.1%}",
                f"{e.error('loo'):+.1%}",
                f"{e.error('fitted'):+.1%}",
            )
        t.add_row(
            "",
            "median |error|",
            "",
            f"{fs.median_abs_error('uncalibrated'):.1%}",
            f"{fs.median_abs_error('loo'):.1%}",
            f"{fs.median_abs_error('fitted'):.1%}",
        )
        for names, loo in g.tried:
            t.add_row("", f"  tried {'+'.join(names)}", "", "", f"{loo:.1%}", "")
    return t
