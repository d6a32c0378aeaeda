"""MaxText's program in the bench scripts (maxtext_compile.py, maxtext_fidelity.py): its base
config, the environment its CPU-only compiles need, and a model file cut to a few layers.

Kept apart from ``_common`` so the GPU check (which imports ``_common``) needs no MaxText."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence


def base_yml() -> str:
    """The installed MaxText's ``configs/base.yml``."""
    import maxtext

    return os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")


def env(dump: str | os.PathLike | None = None) -> dict[str, str]:
    """This environment for a MaxText child on the host platform (no cloud, libtpu on localhost);
    with ``dump``, XLA writes its compiled modules there."""
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "DECOUPLE_GCLOUD": "TRUE",
        "TPU_WORKER_HOSTNAMES": "localhost",
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }
    if dump is not None:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_dump_to={dump}".strip()
    return env


def keys(model: str, layers: int, batch: int, seq: int, extra: Sequence[str]) -> list[str]:
    """MaxText keys for ``model`` cut to ``layers`` layers at a per-device batch and sequence."""
    return [
        f"model_name={model}",
        "override_model_config=true",  # MaxText's switch to override a key its model file sets
        f"base_num_decoder_layers={layers}",
        f"per_device_batch_size={batch}",
        f"max_target_length={seq}",
        *extra,
    ]


def run_cases(
    argv: Sequence[str] | None,
    *,
    doc: str,
    out: str,
    schema: str,
    marker: str,
    cases: Sequence[tuple],
    run_case: Callable[..., dict] | None,
    render: Callable[[dict], str],
    fields: dict | None = None,
    add_args: Callable[[argparse.ArgumentParser], None] | None = None,
    bind: Callable[[argparse.Namespace, argparse.ArgumentParser], Callable] | None = None,
    finish: Callable[[dict], dict] | None = None,
) -> int:
    """The main of a bench script over named MaxText cases: ``--cases NAME,...`` (default all),
    ``--out`` (default ``bench/results/OUT``), ``--docs RECORD`` (the table from a record, nothing
    run), the script's own options (``add_args``); each case (a tuple, its name first) run by
    ``run_case(*case)`` in order — or, with ``bind``, by the function ``bind(args, parser)``
    returns (called before any case runs: it refuses bad options through the parser) — the record
    (the envelope, versions, ``fields``, the cases) written after each, the docs table at the
    end; ``finish(record)``: the record as written (e.g. with figures over its cases)."""
    import _common

    ap = _common.parser(doc, out)
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    if add_args is not None:
        add_args(ap)
    _common.add_docs(ap, schema)
    args = ap.parse_args(argv)
    if args.docs is not None:
        _common.write_docs_table(marker, render(args.docs))
        return 0
    wanted = selected(ap, args.cases, cases)
    if bind is not None:
        run_case = bind(args, ap)
    record = _common.envelope(schema) | {
        "versions": _common.versions("maxtext", "jax", "jaxlib", "libtpu", "jax-cuda13-plugin"),
        **(fields or {}),
        "cases": [],
    }
    for case in cases:
        if case[0] in wanted:
            print(f"case {case[0]} ...", file=sys.stderr, flush=True)
            record["cases"].append(run_case(*case))
            if finish is not None:
                record = finish(record)
            _common.write_record(args.out, record)
    if _common.docs_follow(args.out, out):
        _common.write_docs_table(marker, render(record))
    else:
        print(f"docs table left as it is (--docs {args.out} rewrites it)", file=sys.stderr)
    return 0


def selected(ap, text: str | None, cases) -> list[str]:
    """The case names ``--cases`` (``text``, comma-separated; None: every case) asks for, an
    unknown one refused through ``ap`` naming the cases there are."""
    names = [c[0] for c in cases]
    wanted = text.split(",") if text else names
    unknown = [n for n in wanted if n not in names]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(names)}")
    return wanted
