"""XLA flag merging with the user's own XLA_FLAGS, in a fresh process (the backend reads them once
at start-up): the user's flags are kept and still take effect, the preset's are appended."""

import json
import os
import subprocess
import sys

_PROBE = """
import json, os
from tierax.launch import flags
added = flags.configure(preset="lhs-pipelined", platforms="cpu")
import jax
print(json.dumps({"added": added, "xla_flags": os.environ["XLA_FLAGS"],
                  "devices": len(jax.devices())}))
"""


def _probe(env):
    p = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_users_xla_flags_are_kept_ahead_of_the_presets_and_still_work():
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    mine = "--xla_force_host_platform_device_count=3 --xla_cpu_enable_fast_math=false"
    out = _probe(env | {"XLA_FLAGS": mine})
    preset = [
        "--xla_gpu_enable_latency_hiding_scheduler=true",
        "--xla_gpu_enable_pipelined_host_offloading=true",
    ]
    assert out["added"] == preset
    assert out["xla_flags"].split() == mine.split() + preset
    assert out["devices"] == 3  # the user's flag reached XLA
    alone = _probe(env)
    assert alone["xla_flags"].split() == preset and alone["devices"] == 1
