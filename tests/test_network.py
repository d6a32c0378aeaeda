"""Bandwidth per mesh axis (tierax.costmodel.network) and the cost model's collectives at it,
against hand computation.

Devices lie on the mesh as MeshShape.make lays them: (data, fsdp, tensor, expert), expert innermost.
Every expected number is written out by hand from the device order, the domain size and the link
rates.
"""

from __future__ import annotations

import dataclasses

import pytest

from tierax import costmodel as cm
from tierax import names as N
from tierax.costmodel import network
from tierax.errors import TieraxError
from tierax.models import get_config
from tierax.solving.whatif import override_rates
from tierax.tracing.inventory import Activation, GroupInventory, Inventory
from tierax.tracing.model_program import for_inventory

CFG = get_config("tiny-deepseek")  # float32 parameters and compute: gathered bytes = stored bytes
# NVLink 400 GB/s inside a domain of 8, scale-out 50 GB/s: round numbers, a GPU-like shape.
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


@pytest.mark.parametrize(
    "devices,domain,override,per",
    [
        (128, 72, 0, 64),  # two NVL72 racks, spread evenly: 64 + 64 (not 72 + 56)
        (128, 72, 72, 72),  # --rate gpus_per_domain=72: fill the first rack, 56 in the second
        (1024, 72, 0, 64),  # 16 racks of 64
        (16, 8, 0, 8),  # two DGX H100 nodes
        (8, 72, 0, 8),  # inside one rack
        (73, 72, 0, 72),  # no divisor of 73 in 36..72: fill in order
        (4, 0, 0, 4),  # no domain limit
    ],
)
def test_devices_per_domain(devices, domain, override, per):
    assert network.devices_per_domain(devices, domain, override) == per


def test_gpus_per_domain_above_the_domain_is_refused():
    with pytest.raises(TieraxError, match="at most 72"):
        network.devices_per_domain(128, 72, 80)


def test_deepseek_128_gb200_fsdp_crosses_the_racks_and_expert_stays_inside():
    # Device i = fsdp·8 + expert.  Expert groups are 8 consecutive ids (8k … 8k+7), inside a rack of
    # 64 (and of 72: 72 = 9·8).  An fsdp group is {e, e+8, …, e+120}: ids on both sides of 64 →
    # crosses.
    mesh = {"fsdp": 16, "expert": 8}
    for per in (64, 72):
        assert not network.group_crosses(mesh, ("expert",), per)
        assert network.group_crosses(mesh, ("fsdp",), per)
        assert network.group_crosses(mesh, ("fsdp", "expert"), per)


def test_rack_placement_decides_whether_an_expert_axis_of_16_crosses():
    # expert=16 groups: ids 16k … 16k+15.  Racks of 64: 64 = 4·16, no group straddles.  Racks of 72
    # (fill):
    # the group 64 … 79 holds ids 64 … 71 (rack 0) and 72 … 79 (rack 1).
    mesh = {"fsdp": 8, "expert": 16}
    assert not network.group_crosses(mesh, ("expert",), 64)
    assert network.group_crosses(mesh, ("expert",), 72)


def test_links_for_16_h100_fsdp_16_and_8_inside_one_node():
    h100 = cm.target_rates("h100", "bfloat16")
    # 16 H100s = two nodes of 8: the one fsdp group holds 8 devices of each node, so its rings run
    # over the node's 8 ConnectX-7 NICs, 46 GB/s each for NCCL: 368 GB/s, under NVLink's 450.
    link = network.axis_links({"fsdp": 16}, h100)["fsdp"]
    assert (link.devices, link.crosses_domain, link.bytes_per_s, link.link, link.nics) == (
        16,
        True,
        pytest.approx(368e9),
        "scale-out",
        8,
    )
    # 8 H100s: one node → NVLink 4, 450 GB/s per direction.
    link = network.axis_links({"fsdp": 8}, h100)["fsdp"]
    assert (link.crosses_domain, link.bytes_per_s, link.link) == (False, 450e9, "nvlink")


def test_gb200_128_devices_links():
    links = network.axis_links({"fsdp": 16, "expert": 8}, cm.target_rates("gb200", "bfloat16"))
    assert (links["expert"].bytes_per_s, links["expert"].crosses_domain) == (900e9, False)
    # Two racks of 64 (spread evenly).  An fsdp group {e, e+8, …, e+120} has 8 devices in each rack:
    # 8 NICs × 46 GB/s = 368 GB/s.  The fsdp×expert group (all 128) has 64 per rack: 64 NICs would
    # carry 2944 GB/s, capped at the rack's NVLink 900.
    assert (links["fsdp"].bytes_per_s, links["fsdp"].crosses_domain) == (
        pytest.approx(368e9),
        True,
    )
    assert (links["fsdp"].nics, links["fsdp×expert"].nics) == (8, 64)
    assert (links["fsdp×expert"].bytes_per_s, links["fsdp×expert"].devices) == (900e9, 128)
    assert links["tensor"].link == "none"


def test_a_crossing_group_without_a_scale_out_rate_names_the_fix():
    with pytest.raises(TieraxError, match="--rate scale_out="):
        network.axis_links({"fsdp": 16}, dataclasses.replace(RATES, scale_out_bytes_per_s=0.0))


def _inventory(mesh: dict, tensor_bytes: float = 0.0, expert_bytes: float = 0.0) -> Inventory:
    # One group of 4 layers, forward 1 GFLOP/layer, no unnamed recompute; 40 MB of float32
    # parameters per device; per layer, the forward's tensor all-reduce and expert all-to-all bytes
    # as given.
    by_axis = tuple((a, b) for a, b in (("tensor", tensor_bytes), ("expert", expert_bytes)) if b)
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
        forward_flops_per_layer=1e9,
        layer_param_count=1000,
        forward_collective_bytes_per_layer=tensor_bytes + expert_bytes,
        forward_collective_bytes_by_axis=by_axis,
    )
    return Inventory(
        "hand",
        1,
        8,
        mesh,
        (g,),
        param_bytes=40_000_000,
        grad_bytes=0,
        optimizer_bytes=0,
        logits_bytes=0,
        embed_param_count=0,
    )


def test_fsdp_collectives_inside_one_domain_at_nvlink():
    # fsdp=8 in a domain of 8: gathered = 40 MB × 8 = 320 MB; AG fwd + AG bwd + RS = 3 × 320 MB ×
    # 7/8 = 840 MB at 400 GB/s = 2.1 ms.
    fx = cm.fixed_terms(for_inventory(CFG, _inventory({"fsdp": 8})), RATES, "serial")
    assert fx.collective_s == pytest.approx(840e6 / 400e9, rel=1e-12)


@pytest.mark.parametrize(
    "mesh,nics",
    [
        # ids = fsdp·8 + tensor: an fsdp group {t, t+8} has one device in each domain of 8
        ({"fsdp": 2, "tensor": 8}, 1),
        # ids = fsdp·4 + tensor: {t, t+4, t+8, t+12}, two in each domain
        ({"fsdp": 4, "tensor": 4}, 2),
        # the one fsdp group of 16 holds both domains whole: 8 NICs × 50 GB/s, NVLink's 400 caps it
        ({"fsdp": 16}, 8),
    ],
)
def test_a_crossing_group_runs_over_the_nics_of_its_devices_in_each_domain(mesh, nics):
    link = network.axis_links(mesh, RATES)["fsdp"]
    assert (link.crosses_domain, link.nics) == (True, nics)
    assert link.bytes_per_s == min(400e9, nics * 50e9)


def test_fsdp_collectives_across_two_domains_at_the_scale_out_rate():
    # fsdp=2 × tensor=8 over two domains of 8: each fsdp group has one device per domain, one NIC:
    # 3 × (40 MB × 2) × 1/2 = 120 MB at 50 GB/s = 2.4 ms.
    fx = cm.fixed_terms(for_inventory(CFG, _inventory({"fsdp": 2, "tensor": 8})), RATES, "serial")
    assert fx.collective_s == pytest.approx(120e6 / 50e9, rel=1e-12)
    # --rate gpus_per_domain=16 with nvlink_domain=16 (one domain holds all): back at NVLink, 1800
    # MB / 400 GB/s.
    one = override_rates(RATES, ["nvlink_domain=16", "gpus_per_domain=16"])
    assert cm.fixed_terms(
        for_inventory(CFG, _inventory({"fsdp": 16})), one, "serial"
    ).collective_s == pytest.approx(1800e6 / 400e9)


def test_expert_all_to_all_inside_and_tensor_all_reduce_across():
    # Mesh tensor=2, expert=8 = 16 devices, ids = tensor·8 + expert: expert groups (8 consecutive)
    # inside a domain of 8; tensor groups {e, e+8} cross.  Per layer: 10 MB of all-reduce over
    # tensor, 20 MB of all-to-all over expert; forward + backward = 2× over 4 layers:
    # 2 · 4 · (10 MB / 50 GB/s + 20 MB / 400 GB/s) = 8 · (0.2 ms + 0.05 ms) = 2 ms.  No FSDP axis.
    mesh = {"tensor": 2, "expert": 8}
    inv = dataclasses.replace(_inventory(mesh, 10e6, 20e6), param_bytes=0)
    fx = cm.fixed_terms(for_inventory(CFG, inv), RATES, "serial")
    assert fx.collective_s == pytest.approx(0.002, rel=1e-12)
    # A rematerialised layer repeats its forward's collectives: 4 · 0.25 ms = 1 ms of unnamed
    # recompute.
    (g,) = cm.group_terms(inv, RATES, "serial")
    assert g.base_recompute_s == pytest.approx(0.001, rel=1e-12)


def test_simulate_states_the_link_of_each_axis():
    from tierax import plan as plan_lib

    inv = _inventory({"fsdp": 16})
    plan = plan_lib.Plan(
        "p",
        {
            "moe": plan_lib.GroupPlan(
                {
                    N.DECODER_LAYER_INPUT: plan_lib.Placement.DEVICE,
                    N.MOE_MLPWI_0: plan_lib.Placement.REMAT,
                }
            )
        },
    )
    b = cm.simulate(plan, for_inventory(CFG, inv), RATES, "serial").breakdown
    assert b.network["fsdp"] == {
        "axes": ["fsdp"],
        "devices": 16,
        "crosses_domain": True,
        "bytes_per_s": 400e9,  # 8 NICs × 50 GB/s, NVLink's 400 the cap
        "link": "scale-out",
        "devices_per_domain": 8,
        "nics": 8,
    }
    assert b.rates["interconnect fsdp"].startswith(
        "400 GB/s per direction over 16 devices, spans domains of 8, over 8 NICs per domain"
    )


@pytest.mark.parametrize(
    "text,match",
    [
        ("nvlink_domain=7.5", "whole number"),
        ("gpus_per_domain=0", "> 0"),
        ("scale_out=fast", "finite number"),
    ],
)
def test_bad_network_rate_values_name_the_fix(text, match):
    with pytest.raises(TieraxError, match=match):
        override_rates(RATES, [text])


def _ep_inventory(mesh: dict, groups: list, embed: int) -> Inventory:
    # groups: (name, layers, non-expert params per layer, expert params per layer); no activations'
    # bytes matter.
    gs = tuple(
        GroupInventory(
            name,
            layers,
            (Activation(name, N.DECODER_LAYER_INPUT, 1000, layers, 0.0),),
            carry_bytes_per_layer=1000,
            save_all_bytes_per_layer=2000,
            base_recompute_flops_per_layer=0.0,
            forward_flops_per_layer=1e9,
            layer_param_count=dense + expert,
            expert_param_count_per_layer=expert,
        )
        for name, layers, dense, expert in groups
    )
    # Per device (float32, 4 B): the non-expert weights over all fsdp × expert devices, the experts
    # E over expert and D over fsdp: the same fsdp × expert ways for both when everything divides.
    ways = mesh.get("fsdp", 1) * mesh.get("expert", 1)
    total = sum(layers * (dense + expert) for _, layers, dense, expert in groups) + embed
    return Inventory(
        "hand",
        1,
        8,
        mesh,
        gs,
        param_bytes=4 * total // ways,
        grad_bytes=0,
        optimizer_bytes=0,
        logits_bytes=0,
        embed_param_count=embed,
    )


def test_fsdp_gathers_each_device_local_experts_over_fsdp_only():
    # fsdp=2, expert=4: 8 devices in one domain of 8, 400 GB/s.  4 layers of 1 M non-expert and 8 M
    # expert parameters (float32 compute: 4 B gathered).  Non-expert weights over all 8 devices:
    # each device ends with all 4 M: 3 × 16 MB × 7/8 = 42 MB.  Experts: a device holds 1/4 of them
    # (its 2 of 8) and gathers their D over fsdp=2: 32 M / 4 = 8 M params = 32 MB, 3 × 32 MB × 1/2 =
    # 48 MB.  90 MB / 400 GB/s = 225 µs. (All 36 M parameters gathered over all 8 devices would be 3
    # × 144 MB × 7/8 = 378 MB: 945 µs.)
    inv = _ep_inventory({"fsdp": 2, "expert": 4}, [("moe", 4, 1_000_000, 8_000_000)], embed=0)
    assert inv.param_bytes == 18_000_000  # (4 M + 32 M) × 4 B / 8
    fx = cm.fixed_terms(for_inventory(CFG, inv), RATES, "serial")
    assert fx.collective_s == pytest.approx(90e6 / 400e9, rel=1e-12)
    # expert only (fsdp=1): the non-expert weights gathered over expert=4, the experts not at all:
    # 3 × 16 MB × 3/4 = 36 MB at 400 GB/s.
    inv = _ep_inventory({"expert": 4}, [("moe", 4, 1_000_000, 8_000_000)], embed=0)
    assert cm.fixed_terms(for_inventory(CFG, inv), RATES, "serial").collective_s == pytest.approx(
        36e6 / 400e9, rel=1e-12
    )


def test_deepseek_v3_128_gb200_fsdp_collectives_gather_the_experts_over_fsdp():
    # DeepSeek-V3's shape on 128 GB200s, fsdp=16 × expert=8: both groups cross the two racks of 64;
    # fsdp's groups over 8 NICs per rack (368 GB/s), fsdp×expert's over 64 (capped at NVLink 900).
    # 58 MoE layers of 256 experts × 3 × 7168 × 2048 = 11 274 289 152 expert parameters;
    # non-expert round figures: 200 M per MoE layer, 400 M per dense layer (3), embedding and head 2
    # × 129280 × 7168.
    cfg = get_config("deepseek-v3-671b")  # bfloat16 compute: 2 B gathered per parameter
    expert = 256 * 3 * 7168 * 2048
    embed = 2 * 129280 * 7168
    inv = _ep_inventory(
        {"fsdp": 16, "expert": 8},
        [("dense", 3, 400_000_000, 0), ("moe", 58, 200_000_000, expert)],
        embed=embed,
    )
    non_expert = (
        58 * 200_000_000 + 3 * 400_000_000 + embed
    )  # 14 653 358 080, gathered over 128 devices
    local_experts = (
        58 * expert // 8
    )  # 81 738 596 352 params: a device's 32 experts per layer, over fsdp=16
    expected = (
        3 * non_expert * 2 * 127 / 128 / 900e9 + 3 * local_experts * 2 * 15 / 16 / 368e9
    )  # 0.0969 + 1.2493 s
    fx = cm.fixed_terms(for_inventory(cfg, inv), cm.target_rates("gb200", "bfloat16"), "serial")
    assert fx.collective_s == pytest.approx(expected, rel=1e-12)
    # not the 10.8 s of every device gathering all 654 B expert parameters over fsdp's 368 GB/s
    assert 1.34 < fx.collective_s < 1.35


def test_tensor_and_expert_collectives_stay_exposed_while_fsdp_hides():
    # tensor=2 × expert=8 × fsdp=2 (32 devices, domains of 8).  Per layer 10 MB of tensor
    # all-reduce (its groups {e, e+8} cross: one NIC, 50 GB/s) and 20 MB of expert all-to-all
    # (inside a domain, 400 GB/s): 2 · 4 · (0.2 + 0.05) ms = 2 ms, which the layers wait for.  The
    # FSDP gathers (40 MB × 2 gathered, 3 × 80 MB × 1/2 = 120 MB over fsdp×expert's groups of 16,
    # 8 per domain: min(8 · 50, 400) GB/s → 0.3 ms) hide under the 12 ms of matmuls.
    mesh = {"fsdp": 2, "tensor": 2, "expert": 8}
    inv = _inventory(mesh, 10e6, 20e6)
    fx = cm.fixed_terms(for_inventory(CFG, inv), RATES, "lhs")
    assert fx.critical_collective_s == pytest.approx(0.002, rel=1e-12)
    assert fx.exposed_collective_s == pytest.approx(0.002, rel=1e-12)
    assert fx.collective_s > fx.critical_collective_s + 1e-4  # the FSDP part exists, hidden
    # serial: nothing hides
    serial = cm.fixed_terms(for_inventory(CFG, inv), RATES, "serial")
    assert serial.exposed_collective_s == pytest.approx(serial.collective_s, rel=1e-12)


def test_host_copies_and_collectives_share_one_overlap_budget():
    # fsdp=8 inside one domain: 3 × (40 MB × 8) × 7/8 = 840 MB at 400 GB/s = 2.1 ms of hideable
    # collectives.  Compute is 4 layers × 3 × 1 GFLOP at 1 TFLOP/s = 12 ms plus the optimizer's HBM
    # bytes.  Offloading moe_mlpwi_0 (4 × 2.5 GB at 10 GB/s each way: 1 s of copies) takes far
    # more than the whole window: the copies hide under the layers' compute, and the collectives
    # get only what is left (the optimizer's HBM seconds).
    from tierax import plan as plan_lib

    inv = _inventory({"fsdp": 8})
    g = inv.groups[0]
    big = dataclasses.replace(g.activations[1], bytes_per_layer=2_500_000_000)
    inv = dataclasses.replace(
        inv, groups=(dataclasses.replace(g, activations=(g.activations[0], big)),)
    )
    P = plan_lib.Placement
    keep = {("moe", N.DECODER_LAYER_INPUT): P.DEVICE, ("moe", N.MOE_MLPWI_0): P.DEVICE}
    off = {("moe", N.DECODER_LAYER_INPUT): P.DEVICE, ("moe", N.MOE_MLPWI_0): P.OFFLOAD}
    kept = cm.evaluate(keep, for_inventory(CFG, inv), RATES, "lhs").breakdown
    moved = cm.evaluate(off, for_inventory(CFG, inv), RATES, "lhs").breakdown
    assert kept.collective_s == pytest.approx(840e6 / 400e9, rel=1e-12)
    assert kept.exposed_collective_s == 0  # 2.1 ms under > 12 ms of compute
    hidden = moved.transfer_s - moved.exposed_d2h_s - moved.exposed_h2d_s
    window = moved.compute_s + moved.recompute_s - hidden
    assert hidden == pytest.approx(0.012, rel=1e-9)  # the 12 ms of layer compute
    assert 0 < window < 1e-4
    assert moved.exposed_collective_s == pytest.approx(moved.collective_s - window, rel=1e-12)
    assert moved.exposed_collective_s > 0.002


def test_v5p_slices_meet_over_each_chips_dcn_share():
    # Cloud TPU v5p: 50 Gb/s of DCN per chip = 6.25 GB/s.  Two slices of 4 chips (--rate
    # gpus_per_domain=4): a data group {f, f+4} has one chip per slice, so one chip's share;
    # the fsdp groups stay inside a slice, on ICI (600 GB/s per direction).
    v5p = override_rates(cm.target_rates("v5p", "bfloat16"), ["gpus_per_domain=4"])
    links = network.axis_links({"data": 2, "fsdp": 4}, v5p)
    assert (links["data"].crosses_domain, links["data"].nics) == (True, 1)
    assert links["data"].bytes_per_s == pytest.approx(6.25e9)
    assert (links["fsdp"].crosses_domain, links["fsdp"].bytes_per_s) == (False, 600e9)
