"""What every bench script shares: the record envelope, the ``--out`` check, the atomic write,
the runner for child processes and the reader of XLA's buffer-assignment dump.

Bench scripts run as ``python bench/NAME.py`` (this directory is then first on ``sys.path``) and
import this module as ``_common``; the investigations under ``bench/investigations/`` put this
directory on ``sys.path`` first.  Importing it does not import JAX: a script that only runs the
CLI in child processes records its machine without starting a backend.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

from tierax import records
from tierax.errors import TieraxError
from tierax.fileio import check_output_file, write_text_atomic

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

# DeepSeek-V3 at reduced depth, as CLI arguments: 2 dense + 3 MoE layers (each layer group a real
# loop), the cut the compile benchmarks use.
DEEPSEEK_V3_5_LAYERS = [
    "--model",
    "deepseek-v3-671b",
    "--set",
    "num_layers=5",
    "--set",
    "first_dense_layers=2",
]

# The seed's scale configuration's shape (DeepSeek-V3 671B on 128 GB200s): devices, mesh, tokens
# per device, as CLI arguments.
SEED_SCALE_SHAPE = [
    "--devices",
    "128",
    "--mesh",
    "fsdp=16,expert=8",
    "--microbatch",
    "8",
    "--seq",
    "4096",
]


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as it was typed: ``python bench/NAME.py`` and the arguments (``argv``, default
    ``sys.argv[1:]``)."""
    script = pathlib.Path(sys.argv[0]).resolve()
    name = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", str(name), *(shlex.quote(a) for a in args)])


def versions(*dists: str) -> dict[str, str | None]:
    """The installed version of each distribution (None where it is not installed)."""
    import importlib.metadata

    out: dict[str, str | None] = {}
    for dist in dists:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def envelope(schema: str, argv: Sequence[str] | None = None, *, devices: bool = False) -> dict:
    """The fields every record starts with: schema, command, created, machine (host, CPU, cores,
    Python, the 1-minute load average now), jax version.  JAX-free unless ``devices`` (then the
    machine also names the platform and devices, starting JAX's backend)."""
    doc = records.envelope(schema, command_line(argv), devices=devices)
    doc["machine"] |= {"cores": os.cpu_count(), "load_average_1min": os.getloadavg()[0]}
    return doc


def out_path(text: str) -> pathlib.Path:
    """``--out``'s type: a ``.json`` file in an existing, writable directory.  argparse turns the
    error into exit 2 before the script does any work (defaults are checked too).

    Raises:
      argparse.ArgumentTypeError: another suffix, a missing parent directory, or a place that
        cannot be written.
    """
    p = pathlib.Path(text)
    if p.suffix != ".json":
        raise argparse.ArgumentTypeError(f"{text!r} is not a .json file; name the record NAME.json")
    if not p.parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text!r}: the directory {str(p.parent)!r} does not exist; create it or choose "
            f"another (default: {RESULTS.relative_to(ROOT)}/)"
        )
    try:
        return check_output_file(p, "--out")
    except TieraxError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def docs_record(*schemas: str):
    """``--docs RECORD``'s type: the record read as a mapping, one of ``schemas``.  argparse turns
    the error into exit 2 before anything is written.

    Raises:
      argparse.ArgumentTypeError: a missing or unreadable file, not JSON, or another schema.
    """

    def record(text: str) -> dict:
        try:
            doc = json.loads(pathlib.Path(text).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise argparse.ArgumentTypeError(
                f"{text!r} does not exist; give a record under {RESULTS.relative_to(ROOT)}/"
            ) from None
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise argparse.ArgumentTypeError(f"{text!r} is not a JSON record ({e})") from None
        schema = doc.get("schema") if isinstance(doc, dict) else None
        if schema not in schemas:
            raise argparse.ArgumentTypeError(
                f"{text!r} has schema {schema!r}; this script's docs table renders "
                f"{', '.join(schemas)}"
            )
        return doc

    return record


def parser(doc: str, out: str | None = None) -> argparse.ArgumentParser:
    """A bench script's argument parser: the first paragraph of its docstring ``doc`` describes it;
    with ``out``, ``--out`` (default ``bench/results/OUT``, :func:`add_out`)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    if out is not None:
        add_out(ap, out)
    return ap


def add_out(ap: argparse.ArgumentParser, default: str) -> None:
    """``--out FILE.json`` (default ``bench/results/<default>``), checked by :func:`out_path`."""
    ap.add_argument(
        "--out",
        type=out_path,
        default=str(RESULTS / default),
        metavar="FILE.json",
        help=f"the record to write (default: bench/results/{default})",
    )


def add_docs(ap: argparse.ArgumentParser, *schemas: str, nothing: str = "compiled or run") -> None:
    """``--docs RECORD.json``: rewrite the script's docs table from a record of one of ``schemas``
    and exit, nothing computed (the record checked by :func:`docs_record`); ``nothing``: what the
    help says is not done then."""
    ap.add_argument(
        "--docs",
        metavar="RECORD.json",
        type=docs_record(*schemas),
        help=f"rewrite the docs table from this record and exit (nothing is {nothing})",
    )


def add_quick(ap: argparse.ArgumentParser, what: str = "one tiny case") -> None:
    """``--quick``: a smoke test of the script (``what`` it runs instead, for the help)."""
    ap.add_argument("--quick", action="store_true", help=f"{what} (a smoke test of this script)")


def write_record(path: str | os.PathLike, doc: dict) -> pathlib.Path:
    """Write ``doc`` as indented JSON atomically: a temporary file beside ``path``, then a rename,
    so an interrupted run leaves the previous record (or nothing), never half of one."""
    return write_text_atomic(path, json.dumps(doc, indent=2) + "\n")


def finish(path: str | os.PathLike, doc: dict) -> int:
    """A script's last step: write its record (:func:`write_record`), say where, exit status 0."""
    write_record(path, doc)
    print(f"wrote {path}")
    return 0


def write_readme_section(readme: pathlib.Path, start: str, end: str, body: str) -> None:
    """Replace what stands between the ``start`` and ``end`` marker lines of ``readme`` with
    ``body`` (a bench script's generated table); exits naming the markers where the README does not
    have exactly one of each."""
    text = readme.read_text()
    if text.count(start) != 1 or text.count(end) != 1:
        sys.exit(f"{readme} needs one {start!r} line and one {end!r} line after it")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    readme.write_text(f"{head}{start}\n{body}{end}{tail}")


DOCS = ROOT / "docs"


def docs_page(marker: str) -> pathlib.Path:
    """The one page under docs/ holding the ``<!-- MARKER:start -->`` line of a generated table;
    exits naming the marker where no page, or more than one, holds it."""
    start = f"<!-- {marker}:start -->"
    pages = [p for p in sorted(DOCS.rglob("*.md")) if start in p.read_text()]
    if len(pages) != 1:
        found = ", ".join(str(p.relative_to(DOCS)) for p in pages) or "none"
        sys.exit(f"one page under docs/ must hold {start!r}; found: {found}")
    return pages[0]


def write_docs_table(marker: str, body: str) -> pathlib.Path:
    """Replace the table between ``<!-- MARKER:start -->`` and ``<!-- MARKER:end -->`` on its docs
    page with ``body`` (a bench script's table, generated from its record); the page written."""
    page = docs_page(marker)
    body = body if body.endswith("\n") else body + "\n"
    write_readme_section(page, f"<!-- {marker}:start -->", f"<!-- {marker}:end -->", body)
    return page


def docs_follow(out: str | os.PathLike, default: str) -> bool:
    """Whether a run's record ``out`` is the one its docs table is made from
    (``bench/results/<default>``): only such a run rewrites the table; a record written elsewhere
    (a trial, a subset of cases) leaves the page as it is (``--docs RECORD`` rewrites it)."""
    return pathlib.Path(out).resolve() == (RESULTS / default).resolve()


def made_by(doc: Mapping, jax: bool = True) -> str:
    """How a docs table names its record: its command, its date and (``jax``) the jax version."""
    text = f"`{doc['command']}`, {doc['created'][:10]}"
    return f"{text}, jax {doc['jax_version']}" if jax else text


def docs_written(marker: str, body: str) -> int:
    """``--docs``'s whole work: the table rewritten on its page (:func:`write_docs_table`), the page
    named; exit status 0."""
    print(f"wrote {write_docs_table(marker, body)}")
    return 0


def tierax(*args: str) -> list[str]:
    """The command line that runs the tierax CLI in a child process with this interpreter."""
    return [sys.executable, "-m", "tierax.cli", *args]


@dataclasses.dataclass(frozen=True)
class Run:
    """One finished child process.

    Attributes:
      wall_s: wall-clock seconds from start to exit.
      peak_rss_bytes: the child's peak resident memory (``wait4``'s ``ru_maxrss``); None if it
        could not be measured.
      cpu_s: the child's user + system CPU seconds (None likewise).
    """

    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_bytes: int | None
    cpu_s: float | None


# The child's rusage, taken by a small parent of its own: a process's peak RSS counts the memory of
# the process it was forked from (kept across exec), so the child is forked from this small
# interpreter, not from the bench script (which may hold JAX and gigabytes).  argv: the file that
# receives "maxrss_kib cpu_s", then the command.  Exit status: the child's (127 if it cannot start).
_MEASURE = """
import os, signal, sys
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as e:
        print(f"{sys.argv[2]}: {e}", file=sys.stderr)
    os._exit(127)
_, status, ru = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{ru.ru_maxrss} {ru.ru_utime + ru.ru_stime}")
code = os.waitstatus_to_exitcode(status)
if code < 0:  # die of the same signal
    if -code not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


def run(
    command: Sequence[str],
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> Run:
    """Run ``command`` to its end (stdin closed, stdout and stderr captured as text) and measure
    its wall time, peak resident memory and CPU time.

    Raises:
      subprocess.TimeoutExpired: it ran past ``timeout`` seconds (it is killed first).
    """
    command = [str(c) for c in command]
    with tempfile.TemporaryDirectory(prefix="tierax-bench-run-") as tmp:
        usage_file = os.path.join(tmp, "usage")
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _MEASURE, usage_file, *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,  # one process group: a timeout or Ctrl-C ends both
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException as e:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            if isinstance(e, subprocess.TimeoutExpired):
                raise subprocess.TimeoutExpired(
                    command,
                    timeout,
                    output=out.decode(errors="replace"),
                    stderr=err.decode(errors="replace"),
                ) from None
            raise
        wall = time.perf_counter() - t0
        try:
            maxrss_kib, cpu_s = pathlib.Path(usage_file).read_text().split()
        except (OSError, ValueError):  # the measuring parent itself was killed: nothing measured
            maxrss_kib, cpu_s = None, None
    return Run(
        command=command,
        returncode=proc.returncode,
        stdout=out.decode(errors="replace"),
        stderr=err.decode(errors="replace"),
        wall_s=wall,
        peak_rss_bytes=None if maxrss_kib is None else int(maxrss_kib) * 1024,
        cpu_s=None if cpu_s is None else float(cpu_s),
    )


def compile_case(
    cmd: Sequence[str], *, timeout: float = 1800, env: Mapping[str, str] | None = None
) -> tuple[dict, dict | None]:
    """Run one ``tierax compile ... --json`` child and read its peaks: ``(case, result)``.

    ``case`` holds what every compile record keeps (exit status, command, wall and compile
    seconds, fits, XLA's peak beside the cost model's and the model's relative error, argument and
    temp bytes); a failed child gives ``{"returncode", "error"}`` (its last stderr line) and
    ``result`` None.  ``result`` is the child's whole JSON, for the fields a record adds.  ``env``:
    the child's environment (None: this process's)."""
    proc = run(cmd, timeout=timeout, env=env)
    if proc.returncode != 0:
        return {"returncode": proc.returncode, "error": proc.stderr.strip().splitlines()[-1:]}, None
    r = json.loads(proc.stdout)
    xla, model = r["device_peak_bytes"], r["predicted"]["peak_device_bytes"]
    case = {
        "returncode": 0,
        "command": " ".join(str(c) for c in cmd[2:]),
        "wall_s": proc.wall_s,
        "compile_time_s": r["compile_time_s"],
        "fits": r["fits"],
        "xla_peak_bytes": xla,
        "model_peak_bytes": model,
        "model_error": (model - xla) / xla,
        "device_argument_bytes": r["device_argument_bytes"],
        "device_temp_bytes": r["device_temp_bytes"],
    }
    return case, r


def dump_env(dump: str | os.PathLike) -> dict[str, str]:
    """This process's environment with ``--xla_dump_to=dump`` added to the user's ``XLA_FLAGS``
    (tierax appends its own flags to them: tierax.launch.flags)."""
    return {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump}"}


def case_rows(cases: Mapping[str, dict], columns: int, row) -> list[str]:
    """A compile record's docs-table rows, one per case: ``row(name, case)``, or for a case whose
    child failed (``returncode`` not 0) its name and error with the other ``columns`` left empty."""
    return [
        row(name, c)
        if not c["returncode"]
        else f"| {name} | failed: {' '.join(c['error'])[:80]} |" + " |" * (columns - 2)
        for name, c in cases.items()
    ]


def simulate_breakdown(flags: Sequence[str], *, timeout: float = 900) -> tuple[dict | None, dict]:
    """Run ``tierax simulate FLAGS`` (``flags`` end in ``--json``) in a child: ``(breakdown,
    {})`` — the prediction's breakdown — or ``(None, {"returncode", "error"})`` when it fails."""
    proc = run(tierax("simulate", *flags), timeout=timeout)
    if proc.returncode != 0:
        return None, {"returncode": proc.returncode, "error": proc.stderr.strip().splitlines()[-1:]}
    pred = json.loads(proc.stdout)
    return (pred[0] if isinstance(pred, list) else pred)["breakdown"], {}


def preallocated_temp(dump: pathlib.Path, big: int = 512 * 2**20) -> dict:
    """The step's buffer assignment in an XLA dump directory (``--xla_dump_to``, as
    :func:`dump_env` sets it): its default memory space's preallocated temp (bytes) and the
    distinct buffers of at least ``big`` bytes in it (shape, bytes, offset, instruction).

    Raises:
      FileNotFoundError: ``dump`` holds no step buffer assignment.
      ValueError: the assignment has no preallocated temp in the default memory space.
    """
    found = sorted(dump.glob("*jit_step*after_optimizations-buffer-assignment.txt"))
    if not found:
        raise FileNotFoundError(f"no *jit_step*after_optimizations-buffer-assignment.txt in {dump}")
    text = found[-1].read_text()
    for block in re.split(r"^(?=allocation \d+:)", text, flags=re.M):
        head = block.split("\n", 1)[0]
        m = re.match(r"allocation \d+: size (\d+), (?:page 0, )?preallocated-temp:", head)
        if not m:  # other memory spaces' heaps name a color first
            continue
        values = re.findall(
            r"value: <\d+ (\S+)(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (\w+\[[\d,]*\])",
            block,
        )
        regions: dict[tuple[int, int], dict] = {}
        for name, size, offset, shape in values:
            if int(size) >= big:
                regions.setdefault(
                    (int(offset), int(size)),
                    {"shape": shape, "bytes": int(size), "offset": int(offset), "value": name},
                )
        found_big = sorted(regions.values(), key=lambda r: (-r["bytes"], r["offset"]))
        return {"preallocated_temp_bytes": int(m.group(1)), "buffers": found_big}
    raise ValueError(f"{found[-1]}: no preallocated-temp allocation in the default memory space")
