"""Device memory: what the allocator reports at run time, and what XLA's compiled analysis says.

Backends that implement ``Device.memory_stats()`` (GPU, TPU) report bytes in use and
the peak since the process started; XLA:CPU reports nothing (``None``).  The peak
cannot be reset from JAX, so :class:`PeakProbe` measures a region as
``peak_after − in_use_before`` on each device: exactly the bytes the region added at
its high-water mark when the peak rose inside the region, an upper bound otherwise
(an earlier region had peaked higher).  Pinned-host usage is not in
``memory_stats()`` on the backends tierax has seen; host figures then come from the
compiled analysis (``host_temp_size_in_bytes``: the offloaded residuals), and any
key of ``memory_stats()`` mentioning ``host`` is kept as reported.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

RUNTIME = "runtime"
COMPILED = "compiled"
RUNTIME_NOTE = (
    "runtime peaks are the allocator's (Device.memory_stats); pinned-host bytes are the compiled "
    "figure (memory_analysis host_temp) unless memory_stats reported host keys"
)
NO_RUNTIME_NOTE = (
    "this backend reports no runtime memory (Device.memory_stats() is None, as on XLA:CPU): the "
    "figures are XLA's compiled memory analysis"
)


@dataclass(frozen=True)
class CompiledMemory:
    """XLA's memory analysis of one compiled program (per device, bytes)."""

    argument: int
    output: int
    alias: int
    temp: int
    # The device peak: on a TPU XLA:TPU's own peak_memory_in_bytes (its buffer assignment places
    # temporaries in the space of arguments that die early, so arguments + temp over-counts the
    # steps of bench/results/tpu_probe.json by gigabytes); elsewhere
    # argument + output + temp − alias, as tierax.xla.compile reports it.
    peak: int
    host_argument: int
    host_output: int
    host_temp: int  # offloaded residuals live here on a GPU; 0 on XLA:CPU
    host_alias: int = 0  # host outputs that reuse a host argument's buffer (donated host state)
    peak_source: str = "argument + output + temp − alias"

    @property
    def host_total(self) -> int:
        """Host bytes the program holds: a donated host argument and the output that reuses its
        buffer are one buffer (an offloaded optimizer state), counted once."""
        return self.host_argument + self.host_output - self.host_alias + self.host_temp

    def to_json(self) -> dict:
        return asdict(self) | {"host_total": self.host_total}


XLA_TPU_PEAK = "XLA:TPU's peak_memory_in_bytes (its buffer assignment, arguments included)"


def compiled_memory(compiled, platform: str | None = None) -> CompiledMemory:
    """The memory analysis of a ``jax.stages.Compiled`` run on ``platform`` (default: JAX's
    backend)."""
    if platform is None:
        import jax

        platform = jax.default_backend()
    m = compiled.memory_analysis()

    def get(name: str) -> int:
        return int(getattr(m, name, 0) or 0)

    arg, out, alias, temp = (
        get("argument_size_in_bytes"),
        get("output_size_in_bytes"),
        get("alias_size_in_bytes"),
        get("temp_size_in_bytes"),
    )
    # Not XLA's own peak_memory_in_bytes: on XLA:CPU it did not follow temp (equal for plans whose
    # temp differed).
    peak, source = arg + out + temp - alias, CompiledMemory.peak_source
    if platform == "tpu" and get("peak_memory_in_bytes"):
        peak, source = get("peak_memory_in_bytes"), XLA_TPU_PEAK
    return CompiledMemory(
        arg,
        out,
        alias,
        temp,
        peak,
        get("host_argument_size_in_bytes"),
        get("host_output_size_in_bytes"),
        get("host_temp_size_in_bytes"),
        get("host_alias_size_in_bytes"),
        source,
    )


@dataclass(frozen=True)
class DeviceMemory:
    """One device's allocator statistics (bytes)."""

    device: str
    bytes_in_use: int
    peak_bytes_in_use: int
    bytes_limit: int | None
    host_stats: dict = field(
        default_factory=dict
    )  # any memory_stats key mentioning 'host', as reported

    def to_json(self) -> dict:
        return asdict(self)


def runtime_stats(devices=None) -> list[DeviceMemory] | None:
    """Allocator statistics of ``devices`` (default: the local devices); None where the backend
    reports none."""
    import jax

    out = []
    for d in devices if devices is not None else jax.local_devices():
        s = d.memory_stats()
        if not s or "bytes_in_use" not in s:
            return None
        limit = s.get("bytes_limit")
        out.append(
            DeviceMemory(
                str(d),
                int(s["bytes_in_use"]),
                int(s.get("peak_bytes_in_use", s["bytes_in_use"])),
                int(limit) if limit is not None else None,
                {k: v for k, v in s.items() if "host" in k.lower()},
            )
        )
    return out


@dataclass(frozen=True)
class RuntimePeak:
    """Bytes a measured region added at its high-water mark (the largest over devices)."""

    peak_bytes: int
    exact: bool  # False: an earlier peak was higher, so this is an upper bound
    per_device: tuple[int, ...]
    host_stats: dict


class PeakProbe:
    """Measure the device-memory high-water mark of a region (see the module docstring).

    ``probe = PeakProbe(devices)`` before the region, ``probe.finish()`` after it;
    both are no-ops returning None on backends without ``memory_stats``.
    """

    def __init__(self, devices=None):
        self._devices = list(devices) if devices is not None else None  # iterated twice
        self._before = runtime_stats(self._devices)

    @property
    def available(self) -> bool:
        return self._before is not None

    def finish(self) -> RuntimePeak | None:
        after = runtime_stats(self._devices)
        if self._before is None or after is None:
            return None
        pairs = list(zip(after, self._before, strict=False))
        deltas = [a.peak_bytes_in_use - b.bytes_in_use for a, b in pairs]
        rose = [a.peak_bytes_in_use > b.peak_bytes_in_use for a, b in pairs]
        worst = max(range(len(deltas)), key=deltas.__getitem__)
        host = {k: v for a in after for k, v in a.host_stats.items()}
        return RuntimePeak(deltas[worst], rose[worst], tuple(deltas), host)
