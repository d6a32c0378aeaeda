"""Which mesh axes stay inside one NVLink (ICI) domain, and the bandwidth a collective over each
gets.

Devices lie on the mesh as :meth:`tierax.mesh.MeshShape.make` lays them: the device list reshaped to
(data, fsdp, tensor, expert), so ``expert`` is innermost (contiguous device ids), then ``tensor``,
then ``fsdp``, then ``data``.  Device ``i`` sits in domain ``i // per_domain``, where ``per_domain``
is how many of this job's devices share one domain (:func:`devices_per_domain`).

A collective over a group of devices that all share a domain runs at the domain's link rate (NVLink,
or ICI); a group that spans domains runs over the scale-out network, at one NIC's rate (one per GPU;
a TPU chip's DCN share) times the group's devices in each domain, capped at the domain's own rate.
NCCL spreads its rings over every NIC of a node, so bus bandwidth across nodes scales with the
adapters the group's devices own ("DGX-1 can get 48 GB/s because we have 4 IB adapters instead of
1", NVIDIA/nccl-tests issue 29; "with 8 400 Gbps NICs your peak would be at 400 GB/s", issue 309,
both NCCL maintainers); where the group has unequal numbers of devices in its domains, the fewest
set the rate.  Hierarchical algorithms (NCCL's tree, NVLink SHARP) are not modelled apart: at the
large messages of FSDP they reach about the ring's bus bandwidth.

Placement assumption (overridable with ``--rate gpus_per_domain=N``): a job larger than one domain
spreads evenly over whole domains, as production jobs do (128 GB200s: 64 per NVL72 rack, leaving
each rack's spare trays; not 72 then 56): the largest divisor of the device count between half a
domain and a domain; failing that, domains are filled in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tierax.errors import TieraxError
from tierax.hardware import TPU_TARGETS
from tierax.mesh import AXES, FSDP_AXES

# The groups the cost model prices: each mesh axis alone, and the FSDP group (fsdp × expert) over
# which the non-expert weights are gathered and their gradients reduce-scattered.
FSDP_GROUP = "×".join(FSDP_AXES)


@dataclass(frozen=True)
class AxisLink:
    """One collective group: its axes, devices, whether it leaves a domain, and its per-direction
    rate."""

    axes: tuple[str, ...]
    devices: int
    crosses_domain: bool
    bytes_per_s: float
    link: str  # "nvlink" (in one GPU domain), "ici" (a TPU pod), "scale-out", "none" (1 device)
    per_domain: int = 0  # the job's devices per domain
    nics: int = 0  # scale-out: the NICs (devices per domain) the group's traffic runs over

    def to_json(self) -> dict:
        return {
            "axes": list(self.axes),
            "devices": self.devices,
            "crosses_domain": self.crosses_domain,
            "bytes_per_s": self.bytes_per_s,
            "link": self.link,
            "devices_per_domain": self.per_domain,
            "nics": self.nics,
        }


def devices_per_domain(devices: int, domain: int, override: int = 0) -> int:
    """How many of the job's ``devices`` share one domain of ``domain`` devices (``override`` if >
    0).

    ``domain`` ≤ 0 means unbounded (every device in one domain).

    Raises:
      TieraxError: ``override`` larger than the domain.
    """
    if override > 0:
        if domain > 0 and override > domain:
            raise TieraxError(
                f"--rate gpus_per_domain={override} is more than the {domain} devices one NVLink "
                f"domain holds; give at most {domain} (or raise nvlink_domain)"
            )
        return override
    if domain <= 0 or devices <= domain:
        return devices
    even = [d for d in range(domain, (domain + 1) // 2 - 1, -1) if devices % d == 0]
    return even[0] if even else domain


def _sizes(mesh: dict) -> tuple[int, ...]:
    return tuple(int(mesh.get(a, 1)) for a in AXES)


def _group_domains(mesh: dict, axes: tuple[str, ...], per_domain: int) -> np.ndarray:
    """The domain of each device of each collective group over ``axes``: [groups, group size]
    (device order as ``MeshShape.make``)."""
    sizes = _sizes(mesh)
    ids = np.arange(int(np.prod(sizes))).reshape(sizes)
    inner = [AXES.index(a) for a in axes]
    outer = [k for k in range(len(AXES)) if k not in inner]
    groups = ids.transpose(outer + inner).reshape(-1, int(np.prod([sizes[k] for k in inner])))
    return groups // per_domain


def group_crosses(mesh: dict, axes: tuple[str, ...], per_domain: int) -> bool:
    """Whether any collective group over ``axes`` holds devices of two domains."""
    dom = _group_domains(mesh, axes, per_domain)
    return bool((dom != dom[:, :1]).any())


def nics_per_domain(mesh: dict, axes: tuple[str, ...], per_domain: int) -> int:
    """The fewest devices any collective group over ``axes`` has in one domain it spans: the NICs
    (one per device) its traffic across that domain's boundary runs over."""
    dom = _group_domains(mesh, axes, per_domain)
    return int(min(np.unique(row, return_counts=True)[1].min() for row in dom))


def group_link(mesh: dict, axes: tuple[str, ...], rates) -> AxisLink:
    """The link a collective over ``axes`` runs at, given ``rates`` (a
    :class:`tierax.costmodel.Rates`).

    Raises:
      TieraxError: the group leaves its domain and the target has no scale-out rate.
    """
    n = int(np.prod([int(mesh.get(a, 1)) for a in axes]))
    intra = rates.interconnect_bytes_per_s
    if n == 1:
        return AxisLink(axes, 1, False, intra, "none")
    devices = int(np.prod(_sizes(mesh)))
    per = devices_per_domain(
        devices, getattr(rates, "nvlink_domain_gpus", 0), getattr(rates, "gpus_per_domain", 0)
    )
    if not group_crosses(mesh, axes, per):
        kind = "ici" if rates.target in TPU_TARGETS else "nvlink"
        return AxisLink(axes, n, False, intra, kind, per)
    out = getattr(rates, "scale_out_bytes_per_s", 0.0)
    if out <= 0:
        raise TieraxError(
            f"mesh {'×'.join(axes)} ({n} devices) spans NVLink/ICI domains of {per} devices on "
            f"target {rates.target!r}, which has no scale-out rate; give one with "
            "--rate scale_out=GB/s (per device per direction)"
        )
    nics = nics_per_domain(mesh, axes, per)
    return AxisLink(axes, n, True, min(nics * out, intra), "scale-out", per, nics)


def axis_links(mesh: dict, rates) -> dict[str, AxisLink]:
    """Per mesh axis, and for the FSDP group (:data:`FSDP_GROUP`), the link its collectives run at.

    Raises:
      TieraxError: ``--rate gpus_per_domain`` larger than a domain, whatever the job's size (a
        one-device job runs no collective, so :func:`group_link` alone would never look at it).
    """
    devices_per_domain(
        int(np.prod(_sizes(mesh))),
        getattr(rates, "nvlink_domain_gpus", 0),
        getattr(rates, "gpus_per_domain", 0),
    )
    out = {a: group_link(mesh, (a,), rates) for a in AXES}
    out[FSDP_GROUP] = group_link(mesh, FSDP_AXES, rates)
    return out


def describe(links: dict[str, AxisLink], rates) -> dict[str, str]:
    """``rates.sources``-style lines for the groups that run a collective: "interconnect fsdp" →
    "…"."""
    lines = {}
    for name, link in links.items():
        if link.link == "none":
            continue
        src = rates.sources
        where = (
            ("scale-out: " + src.get("scale_out_bytes_per_s", src.get("scale_out", "network")))
            if link.crosses_domain
            else src.get("interconnect_bytes_per_s", src.get("interconnect", "NVLink"))
        )
        span = (
            f"spans domains of {link.per_domain}, over {link.nics} NICs per domain"
            if link.crosses_domain
            else f"inside one domain of {link.per_domain}"
        )
        lines[f"interconnect {name}"] = (
            f"{link.bytes_per_s / 1e9:g} GB/s per direction over {link.devices} devices, "
            f"{span} ({where})"
        )
    return lines


def ici_dcn(mesh: dict, per_domain: int) -> tuple[dict[str, int], dict[str, int]]:
    """Each axis split into its part inside one domain (ICI/NVLink) and its part across domains
    (DCN/scale-out), as the device order lays it out (expert innermost, then tensor, fsdp, data;
    ``per_domain`` consecutive devices per domain): ``ici[a] × dcn[a] = mesh[a]``.

    Raises:
      TieraxError: the domains do not fall on axis boundaries (a domain holding part of an axis and
        part of the next), which an ICI × DCN mesh cannot express.
    """
    import math

    ici, dcn, room = {}, {}, per_domain
    for a in reversed(AXES):
        s = int(mesh.get(a, 1))
        inside = math.gcd(s, room)
        if inside < s and room // inside > 1:
            raise TieraxError(
                f"mesh {mesh} over domains of {per_domain} devices: axis {a} ({s}) splits a domain "
                f"of {room} remaining devices unevenly; choose axis sizes that divide the domain"
            )
        ici[a], dcn[a] = inside, s // inside
        room //= inside
    return {a: ici[a] for a in AXES}, {a: dcn[a] for a in AXES}
