"""A plan given beside MaxText's program (``--plan`` with ``--maxtext``) as the MaxText keys it
sets: ``remat_policy: custom`` and one placement per name (:func:`.emit.remat_keys`), joined to the
user's own ``key=value`` overrides.

The plan may be a preset (spelled out for the traced program's layer stacks), a tierax plan file,
or MaxText overrides as ``plan --maxtext --emit maxtext`` writes them (its ``remat_policy`` and
per-name keys; its other keys — batch, mesh, tiling — are MaxText's command line for the run it
was planned for, not the plan: where they differ from the run they are named on stderr as not
applied).  A key the user gives with another value than the plan's is refused naming both, as a
key given by a flag and as ``key=value`` is (:func:`.config.merge_flags`).
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import yaml

from tierax import plan as plan_lib
from tierax.errors import TieraxError
from tierax.interop import maxtext_keys as K
from tierax.interop.maxtext_program import config as config_lib
from tierax.interop.maxtext_program import emit

# The keys a plan of MaxText's program sets (what its custom remat policy reads).
PLAN_KEYS = ("remat_policy", *K.REMAT_KEYS)


def _override_file(spec: str) -> tuple[Mapping, str] | None:
    """The mapping and text of ``spec`` where it is MaxText overrides (``remat_policy: custom``)."""
    if spec in plan_lib.PRESETS or not pathlib.Path(spec).is_file():
        return None
    try:
        text = pathlib.Path(spec).read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except (UnicodeDecodeError, yaml.YAMLError, OSError):
        return None
    return (data, text) if K.is_override_file(data) else None


def check(spec: str, user: Sequence[str]) -> None:
    """Refuse, before any work, a ``--plan`` that cannot be read or a ``remat_policy`` the user
    gives other than ``custom`` (the plan is one).

    Raises:
      TieraxError: naming the plan and the key.
    """
    given = config_lib.parse_overrides(user)
    policy = given.get("remat_policy")
    if policy is not None and policy.strip().lower() != "custom":
        raise TieraxError(
            f"--plan {spec} sets MaxText's remat_policy=custom (a placement per name), but "
            f"remat_policy={policy} is given too; give one of them"
        )
    if _override_file(spec) is not None:
        return
    if spec in plan_lib.PRESETS:
        return
    path = pathlib.Path(spec)
    if not path.is_file():
        raise TieraxError(
            f"plan {spec!r} is neither a preset ({', '.join(plan_lib.PRESETS)}) nor an existing "
            "YAML file (a tierax plan, or MaxText overrides that plan --maxtext --emit maxtext "
            f"writes); MaxText's own policies go after the config: remat_policy={spec}"
        )
    try:
        plan_lib.Plan.from_yaml(path.read_text(encoding="utf-8"), source=spec)
    except UnicodeDecodeError as e:
        raise TieraxError(
            f"plan file {spec!r} is not UTF-8 text ({e.reason} at byte {e.start}); give a plan "
            "YAML file"
        ) from None


def plan_keys(spec: str, run) -> tuple[dict[str, str], list[str]]:
    """The MaxText keys the plan ``spec`` sets for the traced MaxText program ``run``
    (:class:`.as_program.MaxTextProgram`), and notes for stderr: an overrides file's other keys
    that differ from ``run``'s (they are not applied), or that it names no model to check.

    Raises:
      TieraxError: an overrides file planned for another MaxText model; the plan names a layer
        stack or an activation the program lacks, places a name differently in two stacks, or
        keeps or offloads a name MaxText has no key for.
    """
    found = _override_file(spec)
    if found is None:
        from tierax.interop import files

        plan = files.load_plan(spec, run.program)
        return {k: str(v) for k, v in emit.remat_keys(emit.uniform(plan, run.program)).items()}, []
    data, text = found
    model, planned = emit.model_of(run), emit.written_for(text)
    if planned is not None and planned != model:
        raise TieraxError(
            f"--plan {spec} was planned for MaxText model {planned}, and this run is {model}: its "
            f"placements name the activations of {planned}'s layers at {planned}'s sizes. Plan "
            f"{model} for its own file: tierax plan --maxtext CONFIG ... --emit maxtext --out FILE"
        )
    keys = {k: _text(v) for k, v in data.items() if k in PLAN_KEYS}
    p = run.program
    ran = emit.run_keys(run, microbatch=p.microbatch, seq=p.seq, grad_accum=run.grad_accum)
    left = [
        f"{k}={_text(v)}"
        for k, v in data.items()
        if k not in PLAN_KEYS and not (k in ran and config_lib.same(_text(v), _text(ran[k])))
    ]
    unchecked = (
        [
            f"--plan {spec} names no MaxText model (no '{emit.HEADER_MODEL.strip()}' line: written "
            f"by hand or by an older tierax), so it was not checked against this run's {model}"
        ]
        if planned is None
        else []
    )
    if not left:
        return keys, unchecked
    return keys, [
        *unchecked,
        f"--plan {spec}: its placements (remat_policy=custom and the per-name keys) are applied; "
        f"its other keys, MaxText's command line for the run it was planned for, are not, and "
        f"differ from this run: {' '.join(left)} (give them after the config as key=value to run "
        "that program)"
    ]


def joined(user: Sequence[str], keys: Mapping[str, str], spec: str) -> list[str]:
    """The user's ``key=value`` overrides with the plan's keys added.

    Raises:
      TieraxError: a key the user gives with another value than the plan's, naming both.
    """
    flags = {k: (v, f"--plan {spec}") for k, v in keys.items()}
    merged = config_lib.merge_flags(config_lib.parse_overrides(user), flags)
    return [f"{k}={v}" for k, v in merged.items()]


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
