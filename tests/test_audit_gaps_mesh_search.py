"""The mesh search's sensitivity rows (issue 60's audit gap: a unit slip in the rate a row
re-ranks at went unseen): each row's rate is the baseline's × its factor, in bytes per second,
written here by hand, and its winner is the winner of a search at that rate set through the
``--rate`` route (GB/s, hand-written)."""

from __future__ import annotations

import pytest
from gpu_budget import hbm_size

from tierax import costmodel as cm
from tierax.models import get_config
from tierax.solving import mesh_search

# tiny-llama on 8 devices, 4 per NVLink domain, scale-out 5 GB/s and NVLink 450 GB/s: the
# collectives are exposed, so each rate moves the winner's tokens/s.  The device leaves the model
# 4.83 MB beside XLA:GPU's fixed bytes (by jaxlib release; 9.5 MB of device memory when those were
# 4 MiB).
SETS = ["gpus_per_domain=4", hbm_size(4_830_696), "scale_out=5", "interconnect=450"]
HAND = {  # (rate, factor) → the row's rate in GB/s
    ("scale_out", 0.5): 2.5,
    ("scale_out", 2.0): 10.0,
    ("interconnect", 0.5): 225.0,
    ("interconnect", 2.0): 900.0,
}


def test_sensitivity_rows_re_rank_at_the_rate_they_state():
    cfg = get_config("tiny-llama")
    rates = cm.override_rates(cm.target_rates("h200", cfg.dtype), SETS)
    base = mesh_search.search(cfg, 8, rates, global_batch=16, seq=128, prune=False)
    rows = mesh_search.sensitivity(base, rates, prune=False)
    assert {(r["rate"], r["factor"]): r["bytes_per_s"] for r in rows} == {
        k: gbps * 1e9 for k, gbps in HAND.items()
    }
    seen = set()
    for r in rows:
        gbps = HAND[(r["rate"], r["factor"])]
        again = mesh_search.search(
            cfg,
            8,
            cm.override_rates(rates, [f"{r['rate']}={gbps}"]),
            global_batch=16,
            seq=128,
            prune=False,
        )
        assert r["winner"] == again.best.mesh.to_dict()
        assert r["winner_tokens_per_s"] == pytest.approx(again.best.tokens_per_s(again.tokens))
        seen.add(round(r["winner_tokens_per_s"]))
    assert len(seen) == 4  # each rate matters here: a wrong one shows
