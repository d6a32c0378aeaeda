"""``tierax inventory --maxtext CONFIG.yml [key=value ...]``: the inventory of MaxText's own program
(:mod:`tierax.interop.maxtext_program`), over the inventory verb's flags."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping

from tierax.errors import TieraxError


def add_args(parser) -> None:
    """``--maxtext FILE`` and the ``key=value`` overrides after it (the inventory verb only)."""
    parser.add_argument(
        "--maxtext",
        metavar="CONFIG.yml",
        help="trace MaxText's own program: a MaxText config (e.g. its configs/base.yml with "
        "model_name=NAME) or model file (configs/models/NAME.yml), loaded by MaxText; MaxText "
        "keys as key=value after it; with --target, the program simulate and plan price for "
        "that target (its attention kernel), else MaxText's CPU program (hardware=cpu)",
    )
    parser.add_argument(
        "maxtext_overrides",
        nargs="*",
        metavar="key=value",
        help="with --maxtext: MaxText config overrides, as MaxText's own command line takes them",
    )


def check_maxtext(args, why: str, also: Mapping[str, object] | None = None) -> bool:
    """The one check of ``--maxtext`` and its overrides every verb runs first: whether MaxText's
    program is asked for; MaxText overrides without ``--maxtext`` refused, and tierax's own model
    options (``--model``, ``--model-config``, ``--set``, and the verb's ``also``: option → value,
    None when not given) refused beside it, the message ending in the verb's ``why``.

    Raises:
      TieraxError: naming the conflicting options and the fix.
    """
    if args.maxtext is None:
        if args.maxtext_overrides:
            raise TieraxError(
                f"MaxText overrides {' '.join(args.maxtext_overrides)} are given without "
                "--maxtext; give --maxtext CONFIG.yml before them (tierax's own models take "
                "--set KEY=VALUE)"
            )
        return False
    options = {
        "--model": args.model,
        "--model-config": args.model_config,
        "--set": args.overrides or None,
        **(also or {}),
    }
    given = [flag for flag, value in options.items() if value is not None]
    if given:
        raise TieraxError(f"--maxtext and {' and '.join(given)} both given: {why}")
    return True


MESH_AUTO = "--mesh auto needs a plan file; give the mesh, e.g. fsdp=8,tensor=2"


def check_args(args) -> None:
    """Refuse what does not go with ``--maxtext`` (or its overrides without it), before any work.

    Raises:
      TieraxError: naming the conflicting options and the fix.
    """
    why = (
        "--maxtext traces MaxText's own model, --model/--model-config tierax's; use one (MaxText "
        "keys go after --maxtext FILE as key=value)"
    )
    if not check_maxtext(args, why):
        return


def cmd_inventory(args) -> int:
    """``tierax inventory``: MaxText's program with ``--maxtext``, else tierax's model."""
    check_args(args)
    if args.maxtext is None:
        from tierax.cli import planning

        return planning.cmd_inventory(args)
    from tierax.cli.common import console
    from tierax.interop import maxtext_program
    from tierax.mesh import parse_mesh
    from tierax.report.tables import inventory_table
    from tierax.tracing import inventory as inv_lib

    mesh = None
    if args.mesh is not None or args.devices is not None:
        if args.mesh == "auto":
            raise TieraxError(MESH_AUTO)
        mesh = parse_mesh(args.mesh, args.devices).to_dict()
    sizes = dict(
        microbatch=args.microbatch if args.microbatch_given else None,
        seq=args.seq if getattr(args, "seq_given", False) else None,
    )
    extra = {}
    if getattr(args, "target_given", False):  # the program simulate and plan price on it
        from tierax import launch

        launch.start()
        run = maxtext_program.program(
            args.maxtext,
            args.maxtext_overrides,
            target=args.target,
            devices=args.devices,
            mesh=mesh,
            **sizes,
        )
        inv = run.program.inventory
        for note in run.notes:
            print(f"note: {note}", file=sys.stderr)
        extra = {
            "maxtext": {
                "target": args.target,
                "attention": run.attention,
                "traced_attention": run.traced_attention,
                "notes": list(run.notes),
            }
        }
    else:  # MaxText's CPU program (hardware=cpu), as its config says
        inv = maxtext_program.inventory(args.maxtext, args.maxtext_overrides, mesh=mesh, **sizes)
    if args.json:
        print(json.dumps(inv_lib.inventory_json(inv) | extra, indent=2))
    else:
        console().print(inventory_table(inv, None))
    return 0
