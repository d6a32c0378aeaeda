"""The collective terms against hand computation: ring factors per collective, which link each
group is priced at (device order as ``MeshShape.make`` lays it: data outermost, expert innermost),
what the schedules hide, and how a job larger than a domain spreads over domains."""

from __future__ import annotations

import dataclasses

import pytest

from tierax import costmodel as cm
from tierax import names as N
from tierax.costmodel import network
from tierax.models import get_config
from tierax.tracing.inventory import Activation, GroupInventory, Inventory
from tierax.tracing.model_program import for_inventory

CFG = get_config("tiny-deepseek")  # float32 parameters and compute: gathered bytes = stored bytes
# NVLink 400 GB/s inside a domain of 8, scale-out 50 GB/s.
RATES = cm.Rates(
    "hand",
    matmul_flops_per_s=1e12,
    hbm_bytes_per_s=4e12,
    d2h_bytes_per_s=10e9,
    h2d_bytes_per_s=10e9,
    interconnect_bytes_per_s=400e9,
    device_memory_bytes=10**15,
    host_memory_bytes=10**15,
    offload_is_real=True,
    nvlink_domain_gpus=8,
    scale_out_bytes_per_s=50e9,
)
MB = 1e6


def _inventory(mesh: dict, *, param_bytes=40 * MB, grad_bytes=40 * MB, flops=1e9) -> Inventory:
    g = GroupInventory(
        "moe",
        4,
        (
            Activation("moe", N.DECODER_LAYER_INPUT, 1000, 4, 0.0),
            Activation("moe", N.MOE_MLPWI_0, 1000, 4, 1e9),
        ),
        carry_bytes_per_layer=1000,
        save_all_bytes_per_layer=2000,
        base_recompute_flops_per_layer=0.0,
        forward_flops_per_layer=flops,
        layer_param_count=1000,
    )
    return Inventory(
        "hand",
        1,
        8,
        {"data": 1, "fsdp": 1, **mesh},
        (g,),
        param_bytes=int(param_bytes),
        grad_bytes=int(grad_bytes),
        optimizer_bytes=0,
        logits_bytes=0,
        embed_param_count=0,
    )


def _by_group(mesh, **kw):
    return cm.collective_s_by_group(for_inventory(CFG, _inventory(mesh, **kw)), RATES)


def test_data_parallel_all_reduce_sends_twice_n_minus_one_over_n_of_the_gradient():
    # data=4 inside a domain: ring all-reduce 2 · 40 MB · 3/4 = 60 MB at 400 GB/s.
    assert _by_group({"data": 4}) == {"data": pytest.approx(60 * MB / 400e9, rel=1e-12)}
    # data=2: 2 · 40 MB · 1/2 = 40 MB.
    assert _by_group({"data": 2})["data"] == pytest.approx(40 * MB / 400e9, rel=1e-12)


def test_data_outside_fsdp_inside_each_priced_at_its_own_link():
    # 16 devices, data=2 × fsdp=8: fsdp groups are 8 consecutive ids (one domain each), the data
    # groups {i, i+8} cross.  FSDP: AG fwd + AG bwd + RS = 3 · (40 MB · 8) · 7/8 = 840 MB at NVLink;
    # data: 2 · 40 MB · 1/2 = 40 MB at the scale-out rate.
    got = _by_group({"data": 2, "fsdp": 8})
    assert got == {
        network.FSDP_GROUP: pytest.approx(840 * MB / 400e9, rel=1e-12),
        "data": pytest.approx(40 * MB / 50e9, rel=1e-12),
    }
    # data=8 × fsdp=2 on domains of 2: fsdp pairs {2k, 2k+1} inside, each data group (stride 2)
    # one device per domain.  FSDP: 3 · 80 MB · 1/2 = 120 MB at NVLink; data: 2 · 40 MB · 7/8 =
    # 70 MB at one device's scale-out rate.
    pairs = dataclasses.replace(RATES, nvlink_domain_gpus=2)
    got = cm.collective_s_by_group(for_inventory(CFG, _inventory({"data": 8, "fsdp": 2})), pairs)
    assert got == {
        network.FSDP_GROUP: pytest.approx(120 * MB / 400e9, rel=1e-12),
        "data": pytest.approx(70 * MB / 50e9, rel=1e-12),
    }


def test_serial_exposes_every_collective_and_lhs_hides_them_under_compute():
    # Many FLOPs: compute exceeds the collectives, which lhs then hides entirely.
    busy = _inventory({"fsdp": 8}, flops=1e12)
    fx = cm.fixed_terms(for_inventory(CFG, busy), RATES, "serial")
    coll = 840 * MB / 400e9
    assert fx.collective_s == pytest.approx(coll, rel=1e-12) and fx.compute_s > coll
    assert fx.exposed_collective_s == pytest.approx(coll, rel=1e-12)
    assert cm.fixed_terms(for_inventory(CFG, busy), RATES, "lhs").exposed_collective_s == 0.0
    # Few FLOPs: lhs exposes what compute cannot cover, exactly.
    idle = _inventory({"fsdp": 8}, flops=1.0)
    lhs = cm.fixed_terms(for_inventory(CFG, idle), RATES, "lhs")
    assert lhs.compute_s < coll
    assert lhs.exposed_collective_s == pytest.approx(coll - lhs.compute_s, rel=1e-9)
    assert cm.fixed_terms(
        for_inventory(CFG, idle), RATES, "serial"
    ).exposed_collective_s == pytest.approx(coll)


@pytest.mark.parametrize(
    "devices, domain, per",
    [
        (144, 72, 72),  # 72 and 48 both divide: the fullest even spread, 2 × 72
        (96, 72, 48),  # 2 racks of 48
        (100, 72, 50),
        (180, 72, 60),  # 60, 45 and 36 divide: 60
        (44, 8, 4),  # only 4 (half a domain, inclusive) divides in 4..8
        (55, 9, 5),  # an odd domain: half is 5 (rounded up)
        (28, 8, 7),
        (9, 8, 8),  # 9 has no divisor in 4..8: fill domains in order
    ],
)
def test_a_job_larger_than_a_domain_spreads_evenly_over_whole_domains(devices, domain, per):
    assert network.devices_per_domain(devices, domain) == per


def test_the_spread_decides_whether_a_group_crosses():
    # 96 devices on domains of 72, spread 48 + 48: fsdp=48 (the inner 48 ids) stays inside one
    # domain; filled in order (72 + 24) it would cross.
    mesh = {"data": 2, "fsdp": 48}
    rates = dataclasses.replace(RATES, nvlink_domain_gpus=72)
    assert network.axis_links(mesh, rates)["fsdp"].crosses_domain is False
    assert network.axis_links(mesh, rates)["data"].crosses_domain is True
    assert network.group_crosses(mesh, ("fsdp",), 72) is True
