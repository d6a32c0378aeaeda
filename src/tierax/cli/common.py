"""What every verb shares: the console, model and plan options, checked sizes, progress."""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from collections.abc import Iterator, Sequence

from tierax.errors import TieraxError


def console(stderr: bool = False):
    from rich.console import Console

    c = Console(stderr=stderr)
    if not c.is_terminal:  # pipes and CI: wide enough for the tables
        c = Console(stderr=stderr, width=160)
    return c


def _whole_number(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number ≥ {minimum}, got {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be ≥ {minimum}, got {value}")
        return value

    parse.__name__ = f"whole number ≥ {minimum}"  # argparse names the type in its messages
    return parse


# argparse types: errors become exit 2 with the usage line.
positive_int = _whole_number(1)
nonnegative_int = _whole_number(0)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (``nan``, ``inf`` and 0 refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def add_set_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config field, e.g. --set d_model=512 (repeatable)",
    )


def add_model_args(parser: argparse.ArgumentParser, *, default: str | None = "tiny-llama") -> None:
    """``--model NAME``, ``--model-config FILE`` and repeated ``--set KEY=VALUE`` (read by
    :func:`resolve_model`)."""
    suffix = f" (default: {default})" if default else ""
    parser.add_argument(
        "--model", metavar="NAME", help=f"named model config, see `tierax models`{suffix}"
    )
    parser.add_argument(
        "--model-config",
        metavar="FILE",
        help="model config YAML (family + fields, as `tierax models show NAME` prints)",
    )
    add_set_arg(parser)
    parser.set_defaults(model_default=default)


def add_size_args(
    parser: argparse.ArgumentParser, *, microbatch: int, seq: int = 64, per_device: bool = True
) -> None:
    what = "sequences per device" if per_device else "sequences in the batch"
    parser.add_argument(
        "--microbatch", type=positive_int, default=microbatch, help=f"{what} (default {microbatch})"
    )
    parser.add_argument(
        "--seq", type=positive_int, default=seq, help=f"sequence length (default {seq})"
    )


def resolve_model(args, extra_overrides: Sequence[str] = (), *, target: str | None = None):
    """The ModelConfig selected by :func:`add_model_args` options, overrides applied in order;
    with ``target``, ``attention: auto`` chosen for the platform that target runs on."""
    from tierax import hardware
    from tierax.interop.files import load_model_config
    from tierax.models import NAMED_CONFIGS, apply_overrides, for_platform, get_config

    if args.model is not None and args.model_config is not None:
        raise TieraxError(
            "--model and --model-config both given; use one: --model NAME for a named config "
            "or --model-config FILE for a config file"
        )
    if args.model_config is not None:
        cfg = load_model_config(args.model_config)
    elif args.model is not None or args.model_default:
        cfg = get_config(args.model if args.model is not None else args.model_default)
    else:
        raise TieraxError(
            f"no model given; use --model NAME ({', '.join(NAMED_CONFIGS)}) or --model-config FILE"
        )
    cfg = apply_overrides(cfg, [*args.overrides, *extra_overrides])
    return cfg if target is None else for_platform(cfg, hardware.platform(target))


def load_plans(text: str, cfg, option: str) -> list:
    """A comma-separated list of presets or plan files, each validated against ``cfg``."""
    from tierax.interop import files

    plans = [files.load_plan(p.strip(), cfg) for p in text.split(",") if p.strip()]
    if not plans:
        raise TieraxError(
            f"{option} is empty; give a preset, a plan YAML file, or a comma-separated list of them"
        )
    return plans


@contextlib.contextmanager
def progress(title: str, total: int, *, disable: bool = False) -> Iterator:
    """A transient rich progress bar; yields ``advance(description, n)``."""
    from rich.progress import Progress

    with Progress(transient=True, disable=disable) as prog:
        task = prog.add_task(title, total=total)
        yield lambda what, n: prog.update(task, advance=n, description=what)


@contextlib.contextmanager
def prepare_progress(console, total_bytes: int | None) -> Iterator:
    """A transient rich bar for ``tierax data prepare``: input bytes read, tokens written, tokens/s.

    Yields ``advance(nbytes, ntokens)``; ``total_bytes`` None (compressed or Parquet inputs):
    a bar without a total.
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("tokenizing"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[tokens]} tokens · {task.fields[rate]} tokens/s"),
        TimeElapsedColumn(),
    )
    with Progress(
        *columns, console=console, transient=True, disable=not console.is_terminal
    ) as prog:
        task = prog.add_task("prepare", total=total_bytes, tokens="0", rate="-")
        t0, done = time.perf_counter(), [0]

        def advance(nbytes: int, ntokens: int) -> None:
            done[0] += ntokens
            dt = time.perf_counter() - t0
            rate = f"{done[0] / dt:,.0f}" if dt > 0 else "-"
            prog.update(task, advance=nbytes, tokens=f"{done[0]:,}", rate=rate)

        yield advance
