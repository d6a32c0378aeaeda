"""A plan of MaxText's program written as MaxText keys: the ``key=value`` overrides a MaxText run of
the same config takes (``remat_policy: custom`` with one placement per name, and every key the
prediction relied on), as a YAML mapping whose header comments give the command line.

The file is overrides, not a config on its own: MaxText applies a model file over a config's own
keys and only command-line keys over a model file's, so the run is MaxText's command line for the
config it was planned from, the user's keys, then these (:func:`read_overrides` reads them back as
``key=value`` strings).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

import yaml

from tierax import names as N
from tierax.errors import TieraxError
from tierax.interop import maxtext_keys as K
from tierax.interop.maxtext_program import config as config_lib

HEADER = "# MaxText overrides written by tierax plan --maxtext"
# The header line naming the MaxText model (model_name, else the file's stem) the plan is for.
HEADER_MODEL = "# tierax MaxText model: "
EXPORT = "#   export "  # an environment line of the header: EXPORT + NAME=VALUE
# The header's command line: RUN + MaxText's config and the user's keys, then RUN_KEYS + this
# file's keys (KEYS_OF_THIS_FILE, a shell substitution that prints them as key=value) + run_name.
RUN = "#   python -m maxtext.trainers.pre_train.train "
RUN_KEYS = "#     "
KEYS_OF_THIS_FILE = (
    '$(python -c \'import sys,yaml; print(" ".join(f"{k}={v}" for k, v in '
    "yaml.safe_load(open(sys.argv[1])).items()))' THIS_FILE)"
)


def uniform(plan, program) -> dict[str, str]:
    """One placement per traced name, as MaxText's ``custom`` policy sets it for every layer.

    Raises:
      TieraxError: a name placed differently in two layer groups, or a name MaxText has no
        ``custom`` key for placed other than remat.
    """
    from tierax.plan import resolve

    by_name: dict[str, dict[str, str]] = {}
    for group, placements in resolve(plan, program).items():
        for name, p in placements.items():
            by_name.setdefault(name, {})[group] = p.value
    bad = {n: g for n, g in by_name.items() if len(set(g.values())) > 1}
    if bad:
        what = "; ".join(
            f"{n}: " + ", ".join(f"{p} in {g}" for g, p in groups.items())
            for n, groups in bad.items()
        )
        raise TieraxError(
            f"plan {plan.name!r} places names differently across MaxText's layer stacks ({what}); "
            "MaxText sets each name once for all layers: plan with --for maxtext"
        )
    out = {n: next(iter(g.values())) for n, g in by_name.items()}
    foreign = [n for n, p in out.items() if n not in K.REMAT_KEYS and p != "remat"]
    if foreign:
        raise TieraxError(
            f"plan {plan.name!r} keeps or offloads {', '.join(foreign)}, which MaxText's custom "
            f"remat policy has no key for (its keys: {', '.join(K.REMAT_KEYS)})"
        )
    return out


def overrides(
    plan,
    run,
    *,
    microbatch: int,
    seq: int,
    grad_accum: int,
) -> dict:
    """The MaxText keys of ``plan`` for the MaxText program ``run``
    (:class:`.program.MaxTextProgram`), in file order: :func:`remat_keys`, then :func:`run_keys`."""
    keys = remat_keys(uniform(plan, run.program))
    return keys | run_keys(run, microbatch=microbatch, seq=seq, grad_accum=grad_accum)


def remat_keys(placements: Mapping[str, str]) -> dict:
    """``remat_policy: custom`` and every key of its policy for one placement per traced name
    (:func:`uniform`): a key the program does not tag takes MaxText's default, the scan's carry
    stays on device (MaxText refuses remat for it)."""
    keys: dict = {"remat_policy": "custom"}
    for key in K.REMAT_KEYS:
        if key in placements:
            keys[key] = str(placements[key])
        else:  # a key this program does not tag: MaxText's default, which nothing here names
            keys[key] = "device" if key == N.DECODER_LAYER_INPUT else "remat"
    if keys[N.DECODER_LAYER_INPUT] == "remat":
        keys[N.DECODER_LAYER_INPUT] = "device"  # the scan's carry (MaxText refuses remat)
    return keys


def run_keys(run, *, microbatch: int, seq: int, grad_accum: int) -> dict:
    """The keys of the run a plan of ``run``'s program was planned for: batch, length,
    accumulation, the ``ici_*``/``dcn_*`` mesh, vocabulary tiling, attention, scanned layers."""
    keys: dict = {}
    tensor = int(run.mesh.get("tensor", 1))
    per = microbatch / tensor
    keys["per_device_batch_size"] = int(per) if per == int(per) else per
    keys["max_target_length"] = seq
    keys["gradient_accumulation_steps"] = grad_accum
    for axis in ("data", "fsdp", "tensor", "expert"):
        keys[f"ici_{axis}_parallelism"] = int(run.mesh.get(axis, 1))
    for axis in ("data", "fsdp", "tensor", "expert"):
        keys[f"dcn_{axis}_parallelism"] = 1
    keys["num_vocab_tiling"] = run.program.head.tiles if run.program.head else 1
    keys["attention"] = run.attention
    keys["scan_layers"] = True
    return keys


def overrides_yaml(
    plan,
    run,
    *,
    path: str,
    user: Sequence[str],
    microbatch: int,
    seq: int,
    grad_accum: int,
    target: str,
    schedule: str,
    predicted_peak: float,
    budget_bytes: float,
    host_bytes: float,
    env: Mapping[str, str],
    why: Sequence[str],
    notes: Sequence[str] = (),
) -> str:
    """:func:`overrides` as a commented YAML mapping (the command line and environment first)."""
    keys = overrides(plan, run, microbatch=microbatch, seq=seq, grad_accum=grad_accum)
    # the user's keys the plan sets are replaced by the plan's (left off the command line)
    rest = [u for u in user if u.partition("=")[0] not in keys]
    config, placing = config_lib.command_config(path)
    argv = " ".join(shlex.quote(a) for a in [*config, *rest])
    lines = [
        f"{K.HEADER_NAME}{plan.name}",
        f"{K.HEADER_DESCRIPTION}{' '.join(plan.description.splitlines())}",
        f"{HEADER_MODEL}{model_of(run)}",
        f"{HEADER} for MaxText's program of {path} on {target}, schedule {schedule}:",
        f"#   predicted peak {predicted_peak / 2**30:.2f} GiB per device (budget "
        f"{budget_bytes / 2**30:.2f} GiB), host {host_bytes / 2**30:.2f} GiB per device.",
        "# These are command-line overrides (MaxText applies a model file over a config file's own",
        "# keys, and command-line keys over both). Run:",
        f"{RUN}{argv} \\",
        f"{RUN_KEYS}{KEYS_OF_THIS_FILE} run_name=RUN",
        *([f"#   ({placing})"] if placing else []),
        "# Environment (XLA reads it when the backend starts):",
        *[f"{EXPORT}{k}={shlex.quote(v)}" for k, v in env.items()],
        *[f"#   ({w})" for w in why],
        *[f"# {n}" for n in notes],
    ]
    lost = not_expressed(plan, run.program)
    if lost:
        lines.append(f"# {lost}")
    return "\n".join(lines) + "\n" + yaml.safe_dump(keys, sort_keys=False)


def not_expressed(plan, program) -> str:
    """What of ``plan`` MaxText's keys cannot say ("" where they say all of it): a layer group
    that keeps its unnamed intermediates (no remat), which MaxText's custom policy recomputes."""
    from tierax.plan import Placement, unnamed_placements

    kept = sorted(g for g, p in unnamed_placements(plan, program).items() if p is Placement.DEVICE)
    if not kept:
        return ""
    return (
        f"NOT EXPRESSED: {', '.join(kept)} keep(s) every intermediate (no remat); MaxText's "
        "custom policy recomputes the unnamed ones"
    )


def model_of(run) -> str:
    """The MaxText model of the program ``run`` (its ``model_name``, else its file's stem)."""
    return run.program.inventory.model


def written_for(text: str) -> str | None:
    """The model an emitted file's header names (:data:`HEADER_MODEL`); None in a file without
    that line (written by hand, or before tierax named it)."""
    for line in text.splitlines():
        if line.startswith(HEADER_MODEL):
            return line.removeprefix(HEADER_MODEL).strip()
    return None


def command_overrides(user: Sequence[str], emitted: Sequence[str]) -> list[str]:
    """The overrides of a run of an emitted file: the user's keys it does not set, then its own."""
    keys = {e.partition("=")[0] for e in emitted}
    return [*(u for u in user if u.partition("=")[0] not in keys), *emitted]


def read_overrides(text: str) -> list[str]:
    """An emitted file's keys as MaxText's ``key=value`` command-line overrides.

    Raises:
      TieraxError: the text is no mapping of keys.
    """
    data = yaml.safe_load(text)
    if not isinstance(data, Mapping):
        raise TieraxError("MaxText overrides: the file holds no mapping of keys")
    return as_args(data)


def read_environment(text: str) -> dict[str, str]:
    """The environment an emitted file's header names (its ``#   export NAME=VALUE`` lines, as
    :func:`overrides_yaml` writes them)."""
    env = {}
    for line in text.splitlines():
        if line.startswith(EXPORT):
            name, _, value = line.removeprefix(EXPORT).partition("=")
            env[name] = shlex.split(value)[0]
    return env


def as_args(keys: Mapping) -> list[str]:
    """MaxText keys as its ``key=value`` command-line overrides (booleans as MaxText writes
    them)."""
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in keys.items()]
