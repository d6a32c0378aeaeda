"""Rich tables for CLI output."""

from __future__ import annotations

from rich.table import Table


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def bench_table(records, peak_flops: float, title: str) -> Table:
    t = Table(title=title, caption=f"MFU against the measured local peak of {peak_flops / 1e12:.3f} TFLOP/s per device")
    for col in ("plan", "step ms", "tokens/s", "TFLOP/s/dev", "MFU", "compiled temp", "act. device", "act. host", "act. remat", "loss"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for r in records:
        t.add_row(
            r.plan,
            f"{r.step_time_s * 1e3:.1f}",
            f"{r.tokens_per_s:,.0f}",
            f"{r.tflops_per_device:.4f}",
            f"{r.mfu:.1%}",
            fmt_bytes(r.compiled_temp_bytes),
            fmt_bytes(r.device_activation_bytes),
            fmt_bytes(r.host_activation_bytes),
            fmt_bytes(r.remat_activation_bytes),
            f"{r.loss:.4f}",
        )
    return t


def models_table(configs) -> Table:
    t = Table(title="named model configs")
    for col in ("name", "family", "layers", "d_model", "params", "activated"):
        t.add_column(col, justify="left" if col in ("name", "family") else "right")
    for cfg in configs:
        t.add_row(cfg.name, cfg.family, str(cfg.num_layers), str(cfg.d_model),
                  f"{cfg.param_count() / 1e9:.3f} B", f"{cfg.activated_param_count() / 1e9:.3f} B")
    return t


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
    t = Table(title=f"{r.model} · plan {r.plan} · {r.target} × {r.devices} · microbatch {r.microbatch}/device × seq {r.seq} · "
                    f"xla preset {r.xla_preset}",
              caption="deviceless XLA:GPU compile (no autotuning: sizes close, not exact); " + "; ".join(r.notes))
    t.add_column("figure")
    t.add_column("per device", justify="right")
    rows = [
        ("arguments", fmt_bytes(r.device_argument_bytes)),
        ("outputs", fmt_bytes(r.device_output_bytes)),
        ("aliased (donated)", fmt_bytes(r.device_alias_bytes)),
        ("temp", fmt_bytes(r.device_temp_bytes)),
        ("device peak", fmt_bytes(r.device_peak_bytes)),
        ("device capacity", fmt_bytes(r.device_capacity_bytes)),
        ("fits", "[green]yes[/]" if r.fits else "[red]no[/]"),
        ("host temp (offloaded)", fmt_bytes(r.host_temp_bytes)),
    ]
    for o in r.offloaded:
        state = fmt_bytes(o.host_bytes) if o.on_host else f"[red]not found[/] (expected {fmt_bytes(o.expected_bytes)})"
        rows.append((f"  offloaded {o.group}/{o.name}", state))
    ov = r.overlap
    rows += [
        ("host transfers per step", str(ov["transfers"])),
        ("transfer bytes", fmt_bytes(ov["transfer_bytes"])),
        ("est. transfer time", f"{ov['est_transfer_s'] * 1e3:.3f} ms"),
        ("est. hidden under compute", f"{ov['est_hidden_s'] * 1e3:.3f} ms"),
        ("est. exposed", f"{ov['est_exposed_s'] * 1e3:.3f} ms"),
        ("compile time", f"{r.compile_time_s:.1f} s"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t
