#!/usr/bin/env python3
"""The TPU kernel rates measured on a chip, extracted from its chip-check records into one record
(bench/results/tpu_kernel_rates.json) and the package data file the cost model's default TPU rates
come from (src/tierax/hardware/tpu_kernel_rates.json); nothing is measured here.

    python bench/tpu_kernel_rates.py     # → both files, from the committed chip records
    python bench/tpu_kernel_rates.py --measured bench/results/chip/tpu_check_first.json \
        --host-link bench/results/tpu_check.json
    python bench/tpu_kernel_rates.py --docs bench/results/tpu_kernel_rates.json   # table + plot

The chip records are ``bench/tpu_check.py``'s (``schema tierax.tpu-check/1``): their ``calibration``
is what ``tierax calibrate`` measured on the chip (``tierax.measure.accel_rates``): bf16 GEMMs at a
step's shapes and by smallest dimension, the splash attention kernel (causal) forward and backward
by sequence length and head dim, a layer's non-matmul work at the bytes the model counts, and the
host link.  ``--measured`` names the record whose run measured the kernels (GEMMs, splash, the
non-matmul work); ``--host-link`` the record whose run measured the host link through the step's
own offload path (the first chip run's host link came from a slower path, which the second run's
round trip replaced); ``--link-beside-compute`` the record of
``bench/investigations/link_beside_compute.py`` (default: the chip's, where it exists), whose rate
beside compute the cost model takes instead of the round trip's (the round trip runs with little
compute beside its copies; a step's copies run beside its layers).  Every figure is copied from
them with the command, chip and jax version that measured it, and each rate's efficiency (the rate
over the measuring chip's datasheet figure from ``tierax.hardware``) is what the cost model scales
to other TPU generations (``tierax.hardware.tpu_rates``).  Shapes the issue asks for that the
records lack are listed as not measured, never filled in.
"""

from __future__ import annotations

import json
import pathlib
import sys

import _common

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

SCHEMA = "tierax.tpu-kernel-rates/1"
CHIP_SCHEMA = "tierax.tpu-check/1"
DOCS_MARKER = "tpu-kernel-rates"
RECORD = "tpu_kernel_rates.json"
MEASURED = _common.RESULTS / "chip" / "tpu_check_first.json"
HOST_LINK = _common.RESULTS / "chip" / "tpu_check_third.json"
PUBLISHED = ROOT / "bench" / "data" / "tpu_published_rates.yaml"
INDEXED = _common.RESULTS / "chip" / "tpu_indexed.json"
LINK_BESIDE = _common.RESULTS / "chip" / "link_beside_compute.json"
LINK_BESIDE_SCHEMA = "tierax.link-beside-compute/1"
INDEXED_SCHEMA = "tierax.tpu-indexed/1"
SWEEP = _common.RESULTS / "chip" / "tpu_kernel_sweep.json"
SWEEP_SCHEMA = "tierax.tpu-kernel-sweep/1"
DATA_FILE = SRC / "tierax" / "hardware" / "tpu_kernel_rates.json"
PLOT = ROOT / "docs" / "results" / "tpu-kernel-rates.png"
# What the issue asks the table to cover (issue 67): splash by sequence 2k-32k and head dim 64, 128,
# 192, causal and not; GEMMs down to an expert's small token counts (below the 128 the MXU tiles).
WANTED_SEQS = (2048, 4096, 8192, 16384, 32768)
WANTED_HEAD_DIMS = (64, 128, 192)
DTYPE = "bfloat16"
TARGETS = ("v5e", "v5p", "v6e", "v7x")


def _rel(path: str | pathlib.Path) -> str:
    p = pathlib.Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(path)


def _chip_record(path: str | pathlib.Path) -> dict:
    doc = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    if doc.get("schema") != CHIP_SCHEMA or "calibration" not in doc:
        raise ValueError(f"{path}: not a chip-check record with a calibration ({CHIP_SCHEMA})")
    return doc


def link_beside_record(path: str | pathlib.Path) -> dict:
    """A ``bench/investigations/link_beside_compute.py`` record made on a TPU: the host link as a
    layer scan's copies see it while its layers compute (the one-value series' slope)."""
    doc = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    if doc.get("schema") != LINK_BESIDE_SCHEMA:
        raise ValueError(f"{path}: not a link-beside-compute record ({LINK_BESIDE_SCHEMA})")
    if doc.get("platform") != "tpu":
        raise ValueError(
            f"{path}: measured on {doc.get('platform')!r}, not a TPU; run "
            "bench/investigations/link_beside_compute.py on the chip"
        )
    if not doc["splits"]["1"].get("rate_bytes_per_s"):
        raise ValueError(f"{path}: its one-value series gives no rate (no exposed sizes)")
    return doc


def indexed_record(path: str | pathlib.Path) -> dict:
    """A ``bench/tpu_indexed.py`` record made on a TPU, as the data file's gather and scatter
    rates with the record that measured them."""
    doc = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    if doc.get("schema") != INDEXED_SCHEMA:
        raise ValueError(f"{path}: not a bench/tpu_indexed.py record ({INDEXED_SCHEMA})")
    dev = doc.get("device", {})
    if dev.get("platform") != "tpu":
        raise ValueError(
            f"{path}: measured on {dev.get('platform')!r}, not a TPU; run bench/tpu_indexed.py "
            "on the chip"
        )
    r = doc["indexed"]
    return {
        "index_op_s": r["index_op_s"],
        "scatter_bytes_per_s": r["scatter_bytes_per_s"],
        "gather": r["gather"],
        "scatters": r["scatters"],
        "from": {
            "record": _rel(path),
            "command": doc["command"],
            "created": doc["created"],
            "device_kind": dev.get("device_kind"),
            "jax": doc.get("jax_version"),
        },
    }


def sweep_record(path: str | pathlib.Path) -> dict:
    """A ``bench/tpu_kernel_sweep.py`` record made on a TPU (not a rehearsal)."""
    doc = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    if doc.get("schema") != SWEEP_SCHEMA:
        raise ValueError(f"{path}: not a bench/tpu_kernel_sweep.py record ({SWEEP_SCHEMA})")
    if doc.get("device", {}).get("platform") != "tpu" or doc.get("tiny"):
        raise ValueError(
            f"{path}: a rehearsal ({doc.get('device', {}).get('platform')!r}"
            f"{', --tiny' if doc.get('tiny') else ''}), not a chip's run; run "
            "bench/tpu_kernel_sweep.py on the chip"
        )
    return doc


def _sweep_provenance(doc: dict, path: str | pathlib.Path) -> dict:
    return {
        "record": _rel(path),
        "command": doc["command"],
        "created": doc["created"],
        "device_kind": doc["device"]["device_kind"],
        "device_count": doc["machine"].get("device_count"),
        "jax": doc.get("jax_version"),
    }


def merge_sweep(rates: dict, sweep: dict, sweep_path: str | pathlib.Path) -> dict:
    """The extraction with the sweep's measurements added where the kernels' record has none:
    its splash shapes (the calibration's method, so its rows join the table as they are; a shape
    both measured keeps the kernels' record's row, the sweep's figure kept beside it as a
    second run's), its GEMM points below the calibration's smallest dimension, what the kernel
    refused, and each row's kernels-alone rates (recorded, not taken: the table's rates are the
    kernel with its wrapper's ops, as a step runs them)."""
    peak = rates["datasheet"]["peak_flops_per_s"]
    prov = _sweep_provenance(sweep, sweep_path)
    have = {(c["seq"], c["head_dim"]): c for c in rates["splash"]}
    refused = []
    for row in sweep.get("splash", []):
        key = (row["seq"], row["head_dim"])
        if "error" in row:
            refused.append([*key, row["error"]])
            continue
        alone = {k: row.get(k) for k in ("kernel_fwd_flops_per_s", "kernel_bwd_flops_per_s")}
        again = {
            "fwd_flops_per_s": row["fwd_flops_per_s"],
            "bwd_flops_per_s": row["bwd_flops_per_s"],
        }
        if key in have:
            have[key]["second_run"] = again | alone | {"from": prov["record"]}
            continue
        rates["splash"].append(_splash_row(row, peak) | alone | {"from": prov["record"]})
    rates["splash"].sort(key=lambda c: (c["head_dim"], c["seq"]))
    smallest = min(g["min_dim"] for g in rates["gemm"])
    anchor = next((g for g in rates["gemm"] if g["min_dim"] == smallest), None)
    added = []
    for g in sweep.get("gemm", []):
        if g["min_dim"] == smallest and anchor is not None:
            anchor["second_run_flops_per_s"] = g["flops_per_s"]
        if g["min_dim"] >= smallest:
            continue
        added.append(
            {
                "min_dim": g["min_dim"],
                "what": "smallest dimension",
                "flops_per_s": g["flops_per_s"],
                "efficiency": g["flops_per_s"] / peak,
                "gemms": [{k: x[k] for k in ("shape", "role", "flops_per_s")} for x in g["gemms"]],
                "from": prov["record"],
            }
        )
    rates["gemm"] = sorted(added, key=lambda g: g["min_dim"]) + rates["gemm"]
    have = {(c["seq"], c["head_dim"]) for c in rates["splash"]}
    nm = rates["not_measured"]
    nm["splash_causal"] = [[s, d] for s, d in nm["splash_causal"] if (s, d) not in have]
    if refused:
        nm["splash_refused"] = refused
    low = min(g["min_dim"] for g in rates["gemm"])
    nm["gemm_min_dim_below"] = low
    nm["gemm_note"] = (
        f"GEMMs whose smallest dimension is below {low} take the nearest measured point's rate"
    )
    rates["sweep_from"] = prov
    if sweep.get("link_beside"):
        rates["link_beside_attention"] = {
            name: {
                "shape": s["shape"],
                "rate_bytes_per_s": s["rate_bytes_per_s"],
                "added_s": [r["added_s"] for r in s["rows"]],
                "layer_bytes": [r["layer_bytes"] for r in s["rows"]],
            }
            for name, s in sweep["link_beside"].items()
        }
    return rates


def _splash_row(c: dict, peak: float) -> dict:
    """A measured splash case (``accel_rates.splash_rates``' row) as the table holds it."""
    return {
        "seq": c["seq"],
        "head_dim": c["head_dim"],
        "causal": True,
        "batch": c["batch"],
        "heads": c["heads"],
        "kv_heads": c["kv_heads"],
        "forward_flops": c["forward_flops"],
        "fwd_flops_per_s": c["fwd_flops_per_s"],
        "bwd_flops_per_s": c["bwd_flops_per_s"],
        "fwd_efficiency": c["fwd_flops_per_s"] / peak,
        "bwd_efficiency": c["bwd_flops_per_s"] / peak,
    }


def _provenance(doc: dict, path: str | pathlib.Path) -> dict:
    cal = doc["calibration"]
    return {
        "record": _rel(path),
        "command": doc["command"],
        "created": doc["created"],
        "calibration_created": cal.get("created"),
        "device_kind": doc["machine"].get("device_kind", cal.get("device_kind")),
        "device_count": doc["machine"].get("device_count"),
        "jax": doc.get("jax_version", cal.get("jax")),
    }


def published_rates(path: str | pathlib.Path = PUBLISHED) -> dict:
    """The kernel rates Google published for generations no chip check measured (the yaml file's
    content, checked): {target: {"gemm": {dtype, what, source, tflops_by_size}}}."""
    import yaml

    from tierax.hardware import TPU_TARGETS

    doc = yaml.safe_load(pathlib.Path(path).read_text(encoding="utf-8")) or {}
    out = {}
    for target, kinds in doc.items():
        if target not in TPU_TARGETS:
            raise ValueError(f"{path}: {target!r} is not a TPU target ({', '.join(TARGETS)})")
        unknown = set(kinds) - {"gemm"}
        if unknown:
            raise ValueError(f"{path}: {target}: unknown kind(s) {sorted(unknown)}; known: gemm")
        g = kinds["gemm"]
        points = [[int(m), float(t) * 1e12] for m, t in g["tflops_by_size"]]
        if g["dtype"] != DTYPE or not points or points != sorted(points):
            raise ValueError(f"{path}: {target}: gemm needs {DTYPE} points in ascending size")
        out[target] = {
            "gemm": {
                "dtype": g["dtype"],
                "what": g["what"],
                "source": " ".join(g["source"].split()),
                "flops_per_s_by_size": points,
            }
        }
    return out


def _devices(prov: dict) -> str:
    """ "N × " of a provenance whose record counted its devices; a record that did not (the
    link-beside-compute measurement runs on one device's copies) says nothing."""
    return f"{prov['device_count']} × " if prov.get("device_count") else ""


def _beside_provenance(doc: dict, path: str | pathlib.Path) -> dict:
    return {
        "record": _rel(path),
        "command": doc["command"],
        "created": doc["created"],
        "device_kind": doc["device_kind"],
        "device_count": doc["machine"].get("device_count"),
        "jax": doc.get("jax_version"),
    }


def _host_link(link: dict, hcal: dict, host: dict, host_path, beside, beside_path) -> dict:
    """The host link the cost model takes: beside compute where that record is given (the rate a
    layer scan's copies get while its layers run matmuls, both directions), else the round trip
    of the chip check's calibration (little compute beside it); the round trip kept either way."""
    round_trip = {
        "d2h_bytes_per_s": hcal["d2h_bytes_per_s"],
        "h2d_bytes_per_s": hcal["h2d_bytes_per_s"],
        "bytes_each_way": link.get("bytes_each_way"),
        "what": link.get("note", "")
        + " (tierax's prefetching layer scan storing one value a layer on the host, against "
        "the same scan keeping it on the device)",
    }
    if beside is None:
        return round_trip
    one = beside["splits"]["1"]
    rate = one["rate_bytes_per_s"]
    return {
        "d2h_bytes_per_s": rate,
        "h2d_bytes_per_s": rate,
        "bytes_each_way": None,
        "layer_bytes": [r["layer_bytes"] for r in one["rows"]],
        "added_s": [r["added_s"] for r in one["rows"]],
        "what": "beside compute: the slope of the time a prefetching layer scan's stores and loads "
        "add (against the scan keeping the value) over the bytes they move, at the sizes past "
        "the layers' compute (each layer runs matmuls; an upper bound, as the layers' work grows "
        "with the value)",
        "round_trip": round_trip | {"from": _provenance(host, host_path)},
    }


def extract(
    measured: dict,
    measured_path: str | pathlib.Path,
    host: dict,
    host_path: str | pathlib.Path,
    published: dict | None = None,
    beside: dict | None = None,
    beside_path: str | pathlib.Path | None = None,
) -> dict:
    """The kernel rates of two chip-check records (the kernels' and the host link's; they may be
    the same record), each section with the record that measured it, what was not measured, and
    the rates Google published for other generations (``published``: :func:`published_rates`)."""
    from tierax.hardware import TPU_TARGETS

    target = measured["target"]
    if host["target"] != target:
        raise ValueError(f"the host-link record is of {host['target']}, the kernels' of {target}")
    spec = TPU_TARGETS[target]
    peak, hbm = spec.peak(DTYPE), spec.hbm_bytes_per_s
    cal = measured["calibration"]
    bench = cal["microbenchmarks"]
    by_size = bench.get(f"matmul_by_size_{DTYPE}", {})
    mix = bench[f"matmul_{DTYPE}"]
    gemms = []
    for dim, rate in cal[f"matmul_size_rates_{DTYPE}"]:
        runs = by_size.get(str(dim))
        shapes = (runs or mix)["gemms"]
        gemms.append(
            {
                "min_dim": int(dim),
                "what": "smallest dimension" if runs else "a step's GEMM mix",
                "flops_per_s": rate,
                "efficiency": rate / peak,
                "gemms": [{k: g[k] for k in ("shape", "role", "flops_per_s")} for g in shapes],
            }
        )
    splash = [_splash_row(c, peak) for c in bench["splash_attention"]]
    nm = bench["nonmatmul"]
    link = host["calibration"]["microbenchmarks"]["host_link"]
    hcal = host["calibration"]
    have = {(c["seq"], c["head_dim"]) for c in splash}
    missing_splash = [[s, d] for d in WANTED_HEAD_DIMS for s in WANTED_SEQS if (s, d) not in have]
    smallest = min(g["min_dim"] for g in gemms)
    return {
        "target": target,
        "dtype": DTYPE,
        "datasheet": {
            "peak_flops_per_s": peak,
            "hbm_bytes_per_s": hbm,
            "source": f"tierax.hardware.TPU_TARGETS[{target!r}] ({spec.name}, Google Cloud TPU "
            "docs: dense bf16 peak, HBM bandwidth)",
        },
        "kernels_from": _provenance(measured, measured_path),
        "host_link_from": (
            _beside_provenance(beside, beside_path) if beside else _provenance(host, host_path)
        ),
        "gemm": gemms,
        "splash": splash,
        "nonmatmul": {
            "bytes_per_s": nm["bytes_per_s"],
            "efficiency": nm["bytes_per_s"] / hbm,
            "shape": nm["shape"],
            "what": "a layer's non-matmul work (norms, activations, residual adds) at the bytes "
            "the cost model counts for it",
        },
        "host_link": _host_link(link, hcal, host, host_path, beside, beside_path),
        "not_measured": {
            "splash_causal": missing_splash,
            "splash_non_causal": "every shape (the chip check runs the causal kernel only)",
            "gemm_min_dim_below": smallest,
            "gemm_note": f"GEMMs whose smallest dimension is below {smallest} (an expert's GEMMs "
            "at small token counts) take the nearest measured point's rate",
            "fp8_gemms": "no fp8 GEMM measured (v5e has no fp8 peak)",
            "other_generations": [t for t in TARGETS if t != target],
        },
        "published": published or {},
    }


def package_data(rates: dict) -> dict:
    """The package data file (``tierax.hardware.tpu_rates``) of an extraction: the rates the cost
    model reads and where they come from."""
    k, h = rates["kernels_from"], rates["host_link_from"]
    link = rates["host_link"]
    if link["d2h_bytes_per_s"] != link["h2d_bytes_per_s"]:
        raise ValueError("the data file holds one host-link rate; the record has two")
    return {
        "format": "tierax.tpu-kernel-rates-data/2",
        "written_by": "python bench/tpu_kernel_rates.py",
        "record": f"bench/results/{RECORD}",
        "target": rates["target"],
        "chip": k["device_kind"],
        "jax": k["jax"],
        "kernels_measured_by": f"{k['command']} ({k['record']}, {k['created']})",
        "host_link_measured_by": f"{h['command']} ({h['record']}, {h['created']})",
        "peak_flops_per_s": rates["datasheet"]["peak_flops_per_s"],
        "hbm_bytes_per_s": rates["datasheet"]["hbm_bytes_per_s"],
        "gemm_by_min_dim": [[g["min_dim"], g["flops_per_s"]] for g in rates["gemm"]],
        "splash_causal": [
            [c["seq"], c["head_dim"], c["fwd_flops_per_s"], c["bwd_flops_per_s"]]
            for c in rates["splash"]
        ],
        "nonmatmul_bytes_per_s": rates["nonmatmul"]["bytes_per_s"],
        "host_link_bytes_per_s": link["d2h_bytes_per_s"],
        "host_link_what": (
            "beside compute: a prefetching layer scan's copies while its layers run matmuls"
            if "round_trip" in link
            else "a round trip through a prefetching layer scan"
        ),
        **(
            {
                "index_op_s": rates["indexed"]["index_op_s"],
                "scatter_bytes_per_s": rates["indexed"]["scatter_bytes_per_s"],
                "indexed_measured_by": "{command} ({record}, {created})".format(
                    **rates["indexed"]["from"]
                ),
            }
            if rates.get("indexed")
            else {}
        ),
        "published_gemm": {
            t: {"source": p["gemm"]["source"], "by_size": p["gemm"]["flops_per_s_by_size"]}
            for t, p in rates.get("published", {}).items()
        },
    }


def data_text(rates: dict) -> str:
    """The package data file's text."""
    return json.dumps(package_data(rates), indent=2) + "\n"


def _targets_rows(doc: dict) -> list[str]:
    """The cost model's default rates per TPU target (``tierax.hardware.tpu_rates``: the package
    data file this script writes beside the record)."""
    from tierax.hardware import TPU_TARGETS, tpu_rates

    r = doc["rates"]
    small = r["gemm"][0]["min_dim"]
    head = (
        "| target | bf16 peak (datasheet) | GEMMs, step shapes | GEMMs, smallest dim "
        f"{small} | splash seq 8192, head dim 128 (fwd / bwd) | non-matmul HBM | "
        "host link | source |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---|"]
    for key in TARGETS:
        spec = TPU_TARGETS[key]
        k = tpu_rates.for_target(spec, DTYPE)
        att = {(s, h): (f, b) for s, h, f, b in k.attention_table}.get((8192, 128))
        att = f"{att[0] / 1e12:.0f} / {att[1] / 1e12:.0f} TFLOP/s" if att else "—"
        own = key == r["target"]
        link = (
            f"{k.host_link / 1e9:.2f} GB/s"
            if own
            else f"{spec.host_link_bps / 1e9:.0f} GB/s (the table's)"
        )
        scaled = f"{r['target']} efficiencies × {key} datasheet"
        if key in r.get("published", {}):
            scaled = f"GEMMs: Google's published {key} table; the rest: {scaled}"
        lines.append(
            f"| {key} | {spec.peak(DTYPE) / 1e12:.0f} TFLOP/s | {k.matmul / 1e12:.0f} TFLOP/s | "
            f"{k.size_rates[0][1] / 1e12:.0f} TFLOP/s | {att} | {k.hbm / 1e9:.0f} GB/s | {link} | "
            + ("measured on the chip" if own else scaled)
            + ("; per JAX device (half a chip)" if spec.devices_per_chip == 2 else "")
            + " |"
        )
    return lines


def _published_rows(published: dict) -> list[str]:
    """The docs lines of the rates Google published for other generations."""
    from tierax.hardware import TPU_TARGETS, tpu_rates

    out = []
    for target, p in published.items():
        g = p["gemm"]
        peak = TPU_TARGETS[target].peak(DTYPE)
        size, rate = tpu_rates.large_gemm_rate(g["flops_per_s_by_size"])
        out += [
            "",
            f"Published for {target} ({g['what']}; {g['source']}); the cost model's {target} "
            f"GEMMs take the share at m = n = k = {size}, the first size within "
            f"{tpu_rates.PLATEAU:.0%} of the largest's rate ({rate / peak:.1%}), with the "
            "measured shares by smallest dimension scaled to it:",
            "",
            "| m = n = k | TFLOP/s per device | share of the datasheet |",
            "|---:|---:|---:|",
            *(f"| {m} | {f / 1e12:.1f} | {f / peak:.1%} |" for m, f in g["flops_per_s_by_size"]),
        ]
    return out


def markdown(doc: dict) -> str:
    """The docs section of a record: the measured rates with their shapes and efficiencies, what
    was not measured, and each TPU target's default rates."""
    r = doc["rates"]
    k, h = r["kernels_from"], r["host_link_from"]
    ds = r["datasheet"]
    out = [
        f"Extracted by {_common.made_by(doc)} from the chip records below; the datasheet figures "
        f"are {ds['source']}: {ds['peak_flops_per_s'] / 1e12:.0f} TFLOP/s bf16, "
        f"{ds['hbm_bytes_per_s'] / 1e9:.0f} GB/s HBM.",
        "",
        f"- kernels (GEMMs, splash, non-matmul work): `{k['record']}`, measured by "
        f"`{k['command']}` on {k['device_count']} × {k['device_kind']}, jax {k['jax']}, "
        f"{k['created']}",
        f"- host link: `{h['record']}`, measured by `{h['command']}` on "
        f"{_devices(h)}{h['device_kind']}, jax {h['jax']}, {h['created']}",
        *(
            [
                f"- the shapes the calibration did not measure (rows marked †): "
                f"`{w['record']}`, measured by `{w['command']}` on {w['device_kind']}, "
                f"jax {w['jax']}, {w['created']}"
            ]
            if (w := r.get("sweep_from"))
            else []
        ),
        "",
        "| kernel | shape | measured | share of the datasheet |",
        "|---|---|---:|---:|",
    ]
    for g in r["gemm"]:
        shapes = sorted({"×".join(map(str, x["shape"])) for x in g["gemms"]})
        what = (
            f"smallest dimension {g['min_dim']}{' †' if g.get('from') else ''}"
            if g["what"] == "smallest dimension"
            else f"a step's GEMM mix (smallest dimension {g['min_dim']})"
        )
        out.append(
            f"| bf16 GEMMs, {what} | {', '.join(shapes)} (M×K×N; forward, input and weight "
            f"gradients) | {g['flops_per_s'] / 1e12:.1f} TFLOP/s | {g['efficiency']:.1%} |"
        )
    for c in r["splash"]:
        alone = c.get("kernel_fwd_flops_per_s") and c.get("kernel_bwd_flops_per_s")
        out.append(
            f"| splash attention (causal), seq {c['seq']}, head dim {c['head_dim']}"
            f"{' †' if c.get('from') else ''} | batch "
            f"{c['batch']}, {c['heads']} heads over {c['kv_heads']} kv heads | forward "
            f"{c['fwd_flops_per_s'] / 1e12:.1f}, backward {c['bwd_flops_per_s'] / 1e12:.1f} "
            "TFLOP/s"
            + (
                f" (kernels alone {c['kernel_fwd_flops_per_s'] / 1e12:.1f} / "
                f"{c['kernel_bwd_flops_per_s'] / 1e12:.1f})"
                if alone
                else ""
            )
            + f" | {c['fwd_efficiency']:.1%} / {c['bwd_efficiency']:.1%} |"
        )
    nm = r["nonmatmul"]
    shape = ", ".join(f"{a} {b}" for a, b in nm["shape"].items())
    out.append(
        f"| a layer's non-matmul work, at the bytes the model counts | {shape} | "
        f"{nm['bytes_per_s'] / 1e9:.0f} GB/s | {nm['efficiency']:.1%} |"
    )
    link = r["host_link"]
    trip = link.get("round_trip", link)
    if "round_trip" in link:
        sizes = ", ".join(f"{b / 2**20:.0f}" for b in link["layer_bytes"])
        out.append(
            f"| host link beside compute (a layer scan's copies while its layers run matmuls; "
            f"the cost model's) | {sizes} MiB a layer | "
            f"{link['d2h_bytes_per_s'] / 1e9:.2f} GB/s per direction | — |"
        )
    out.append(
        f"| host link through the step's offload path (round trip, little compute beside) | "
        f"{trip['bytes_each_way'] / 2**30:.2f} GiB each way | "
        f"{trip['d2h_bytes_per_s'] / 1e9:.2f} GB/s per direction | — |"
    )
    for a in r.get("link_beside_attention", {}).values():
        sizes = ", ".join(f"{b / 2**20:.0f}" for b in a["layer_bytes"])
        rate = a["rate_bytes_per_s"]
        out.append(
            f"| host link beside splash attention † (a layer scan's copies while its layers run "
            f"{a['shape']['matmuls']} splash calls, head dim {a['shape']['attention'][1]}; "
            f"recorded, not taken) | {sizes} MiB a layer | "
            + (f"{rate / 1e9:.2f} GB/s per direction" if rate else "no rate (the copies hid)")
            + " | — |"
        )
    nmz = r["not_measured"]
    missing = ", ".join(f"seq {s} × head dim {d}" for s, d in nmz["splash_causal"])
    refused = "; ".join(
        f"seq {s} × head dim {d} ({e.split(':')[0]})" for s, d, e in nmz.get("splash_refused", [])
    )
    out += [
        "",
        "Not measured yet (the cost model takes the nearest measured point there, and says so):",
        "",
        f"- splash attention (causal): {missing or 'none'}"
        + (f"; refused by the kernel: {refused}" if refused else ""),
        f"- splash attention without a causal mask: {nmz['splash_non_causal']}",
        f"- {nmz['gemm_note']}",
        f"- fp8 GEMMs: {nmz['fp8_gemms']}",
        f"- any chip of {', '.join(nmz['other_generations'])}: their rates are the "
        f"{r['target']} efficiencies times their own datasheet, but for what Google published "
        "(below)",
        *_published_rows(r.get("published", {})),
        "",
        "The cost model's default rates per TPU target (`tierax simulate --target TARGET` prints "
        "each with its source):",
        "",
        *_targets_rows(doc),
        "",
        "![measured kernel rates as shares of the datasheet peak](tpu-kernel-rates.png)",
    ]
    return "\n".join(out) + "\n"


def plot(doc: dict, out: str | pathlib.Path = PLOT) -> pathlib.Path:
    """GEMM and splash efficiency against shape, from the record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tierax.fileio import png_metadata

    r = doc["rates"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    dims = [g["min_dim"] for g in r["gemm"]]
    a.plot(dims, [g["efficiency"] for g in r["gemm"]], "o-", color="tab:blue")
    for g in r["gemm"]:
        a.annotate(
            f"{g['flops_per_s'] / 1e12:.0f}",
            (g["min_dim"], g["efficiency"]),
            xytext=(4, -12),
            textcoords="offset points",
            fontsize=8,
        )
    a.set_xscale("log", base=2)
    a.set_xticks(dims, [str(d) for d in dims])
    a.set_ylim(0, 1.05)
    a.set_xlabel("GEMM smallest dimension (largest point: a step's GEMM mix)")
    a.set_ylabel("measured / datasheet bf16 peak")
    a.set_title("bf16 GEMMs (TFLOP/s annotated)")
    a.grid(True, lw=0.3)
    colours = {64: "tab:orange", 128: "tab:green", 192: "tab:purple"}
    for hd in sorted({c["head_dim"] for c in r["splash"]}):
        cs = sorted((c for c in r["splash"] if c["head_dim"] == hd), key=lambda c: c["seq"])
        seqs = [c["seq"] for c in cs]
        col = colours.get(hd, "tab:gray")
        b.plot(seqs, [c["fwd_efficiency"] for c in cs], "o-", color=col, label=f"d={hd} fwd")
        b.plot(seqs, [c["bwd_efficiency"] for c in cs], "s--", color=col, label=f"d={hd} bwd")
    seqs = sorted({c["seq"] for c in r["splash"]})
    b.set_xscale("log", base=2)
    b.set_xticks(seqs, [str(s) for s in seqs])
    b.set_ylim(0, 1.05)
    b.set_xlabel("sequence length")
    b.set_ylabel("measured / datasheet bf16 peak")
    b.set_title("splash attention, causal")
    b.legend(fontsize=8)
    b.grid(True, lw=0.3)
    fig.suptitle(
        f"{r['kernels_from']['device_kind']} ({r['target']}), jax {r['kernels_from']['jax']}: "
        f"{r['kernels_from']['record']}"
        + (f" + {r['sweep_from']['record']}" if r.get("sweep_from") else ""),
        fontsize=9,
    )
    fig.tight_layout()
    path = pathlib.Path(out)
    fig.savefig(path, dpi=100, metadata=png_metadata("tpu kernel rates"))
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = _common.parser(__doc__, RECORD)
    ap.add_argument(
        "--measured",
        metavar="CHIP.json",
        default=str(MEASURED),
        help=f"the chip-check record whose run measured the kernels (default: {_rel(MEASURED)})",
    )
    ap.add_argument(
        "--host-link",
        metavar="CHIP.json",
        default=str(HOST_LINK),
        help=f"the chip-check record whose run measured the host link (default: {_rel(HOST_LINK)})",
    )
    ap.add_argument(
        "--link-beside-compute",
        metavar="LINK.json",
        default=None,
        help="the bench/investigations/link_beside_compute.py record of the host link beside "
        f"compute on the chip, the cost model's host link (default: {_rel(LINK_BESIDE)} where it "
        "exists; without one, the round trip of --host-link)",
    )
    ap.add_argument(
        "--indexed",
        metavar="CHIP.json",
        default=None,
        help="the bench/tpu_indexed.py record of the gathers' and scatters' rates on the chip "
        f"(default: {_rel(INDEXED)} where it exists)",
    )
    ap.add_argument(
        "--sweep",
        metavar="SWEEP.json",
        default=None,
        help="the bench/tpu_kernel_sweep.py record of the shapes the calibration did not measure "
        f"(default: {_rel(SWEEP)} where it exists)",
    )
    ap.add_argument(
        "--published",
        metavar="FILE.yaml",
        default=str(PUBLISHED),
        help=f"kernel rates Google published for other generations (default: {_rel(PUBLISHED)})",
    )
    ap.add_argument(
        "--data-file",
        metavar="FILE.json",
        default=str(DATA_FILE),
        help=f"the package data file to write (default: {_rel(DATA_FILE)})",
    )
    _common.add_docs(ap, SCHEMA, nothing="extracted")
    args = ap.parse_args(argv)
    if args.docs is not None:
        print(f"wrote {plot(args.docs)}")
        return _common.docs_written(DOCS_MARKER, markdown(args.docs))
    try:
        measured, host = _chip_record(args.measured), _chip_record(args.host_link)
        beside_path = args.link_beside_compute or (
            str(LINK_BESIDE) if LINK_BESIDE.exists() else None
        )
        beside = link_beside_record(beside_path) if beside_path else None
        rates = extract(
            measured,
            args.measured,
            host,
            args.host_link,
            published_rates(args.published),
            beside,
            beside_path,
        )
        sweep = args.sweep or (str(SWEEP) if SWEEP.exists() else None)
        if sweep:
            rates = merge_sweep(rates, sweep_record(sweep), sweep)
        indexed = args.indexed or (str(INDEXED) if INDEXED.exists() else None)
        if indexed:
            rates["indexed"] = indexed_record(indexed)
    except (OSError, ValueError, KeyError) as e:
        ap.error(f"cannot extract the rates: {e}")
    doc = _common.envelope(SCHEMA, argv) | {
        "note": "copied from the chip records named in kernels_from and host_link_from (measured "
        "there by tierax calibrate's TPU path); nothing measured or fitted here",
        "rates": rates,
    }
    _common.write_record(args.out, doc)
    print(f"wrote {args.out}")
    if _common.docs_follow(args.out, RECORD):
        from tierax.fileio import write_text_atomic

        write_text_atomic(args.data_file, data_text(rates))
        print(f"wrote {args.data_file}")
        print(f"wrote {plot(doc)}")
        _common.docs_written(DOCS_MARKER, markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
