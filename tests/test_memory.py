"""Runtime and compiled memory figures (tierax.measure.memory).

XLA:CPU reports no memory_stats, so the runtime logic is exercised with stand-in devices.
"""

import jax
import jax.numpy as jnp

from tierax.measure import memory as M


class FakeDevice:
    def __init__(self, **stats):
        self.stats = stats

    def memory_stats(self):
        return dict(self.stats) if self.stats else None

    def __str__(self):
        return "fake:0"


def test_peak_probe_exact_when_the_peak_rises_inside_the_region():
    d = FakeDevice(bytes_in_use=100, peak_bytes_in_use=500, bytes_limit=1000)
    probe = M.PeakProbe([d])
    d.stats = {
        "bytes_in_use": 120,
        "peak_bytes_in_use": 800,
        "bytes_limit": 1000,
        "pinned_host_bytes_in_use": 7,
    }
    r = probe.finish()
    assert (r.peak_bytes, r.exact, r.per_device) == (700, True, (700,))
    assert r.host_stats == {"pinned_host_bytes_in_use": 7}


def test_peak_probe_upper_bound_when_an_earlier_peak_was_higher():
    d = FakeDevice(bytes_in_use=120, peak_bytes_in_use=800, bytes_limit=1000)
    probe = M.PeakProbe(iter([d]))  # any iterable of devices (bench passes mesh.devices.flat)
    d.stats = {"bytes_in_use": 130, "peak_bytes_in_use": 800, "bytes_limit": 1000}
    r = probe.finish()
    assert (r.peak_bytes, r.exact) == (680, False)


def test_peak_probe_takes_the_worst_device():
    a, b = (
        FakeDevice(bytes_in_use=0, peak_bytes_in_use=0),
        FakeDevice(bytes_in_use=10, peak_bytes_in_use=10),
    )
    probe = M.PeakProbe([a, b])
    a.stats, b.stats = (
        {"bytes_in_use": 0, "peak_bytes_in_use": 50},
        {"bytes_in_use": 10, "peak_bytes_in_use": 90},
    )
    assert probe.finish().per_device == (50, 80) and probe.finish().peak_bytes == 80


def test_no_runtime_stats_on_cpu():
    assert M.runtime_stats() is None  # XLA:CPU
    probe = M.PeakProbe()
    assert not probe.available and probe.finish() is None


def test_compiled_memory_of_a_real_program():
    compiled = jax.jit(lambda x: (x @ x).sum()).lower(jnp.ones((64, 64), jnp.float32)).compile()
    cm = M.compiled_memory(compiled)
    assert cm.argument == 64 * 64 * 4
    assert cm.peak == cm.argument + cm.output + cm.temp - cm.alias
    assert cm.host_total == 0  # nothing offloaded (and XLA:CPU has no host memory space)
    assert cm.to_json()["host_total"] == 0
