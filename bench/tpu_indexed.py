#!/usr/bin/env python3
"""XLA's gathers and scatters on an accelerator, as a step runs them
(:func:`tierax.measure.accel_rates.indexed_rates`): seconds per index of an element gather, and the
bytes per second a row scatter-add writes once its indices are paid for.  On a TPU chip these are
the rates the cost model prices a step's gathers and scatters at (``bench/tpu_kernel_rates.py
--indexed`` copies them into the TPU default rates; ``tierax calibrate`` measures them on the
target); on XLA:CPU the figures are recorded, never used.

    python bench/tpu_indexed.py --out bench/results/chip/tpu_indexed.json     # on the chip, ~20 s
"""

from __future__ import annotations

import sys

import _common

SCHEMA = "tierax.tpu-indexed/1"


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "chip/tpu_indexed.json")
    args = ap.parse_args(argv)
    from tierax import launch

    launch.start(run_step=True)
    import jax

    from tierax.measure import accel_rates

    doc = _common.envelope(SCHEMA, argv, devices=True)
    dev = jax.devices()[0]
    doc["device"] = {"platform": dev.platform, "device_kind": dev.device_kind}
    doc["indexed"] = accel_rates.indexed_rates()
    r = doc["indexed"]
    print(
        f"{dev.device_kind}: {r['index_op_s'] * 1e9:.2f} ns per index, scatters at "
        f"{r['scatter_bytes_per_s'] / 1e9:.1f} GB/s"
    )
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    sys.exit(main())
