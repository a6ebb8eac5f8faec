"""`--exchange auto`: every rank measures, rank 0 decides, every rank uses the same choice."""

import json

import torch

from scalesgd.comm.codecs import CodecSettings
from scalesgd.models import build_model
from scalesgd.sim.auto import PLANS, RESOLUTION, choose, decide
from tests.spawn_util import run_workers


def _decide(rank, world):
    torch.manual_seed(0)
    model = build_model("resnet8", 10, 3)
    batch = (torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,)))
    decision = decide(model, batch, torch.nn.functional.cross_entropy, ("fp32", "fp16", "topk-global"),
                      CodecSettings(density=0.01), "ring", None, None, 1, 4)
    return decision.to_dict()


def test_every_rank_gets_rank_zeros_choice_of_the_fastest_candidate():
    first, second = run_workers(_decide, 2)
    assert first == second
    table = first["candidates"]
    # every plan for the dense codecs, the codec's own bucket rule for topk-global (one bucket)
    assert sorted((r["codec"], r["buckets"]) for r in table) == sorted(
        [(c, p) for c in ("fp32", "fp16") for p in PLANS] + [("topk-global", "single")])
    fastest = min(r["iteration_s"] for r in table)
    tied = [r for r in table if r["iteration_s"] <= fastest * (1 + RESOLUTION)]
    chosen = next(r for r in table if (r["codec"], r["buckets"]) == (first["codec"], first["buckets"]))
    assert chosen in tied and chosen["buckets_n"] == min(r["buckets_n"] for r in tied)
    assert first["predicted_s"] == chosen["iteration_s"] and len(first["groups"]) == chosen["buckets_n"]
    assert sorted(i for g in first["groups"] for i in g) == list(range(len(list(build_model("resnet8", 10, 3)
                                                                               .parameters()))))
    json.dumps(first)  # what summary.json and auto.json hold


def test_a_tie_goes_to_the_fewest_buckets():
    table = [{"iteration_s": 1.00, "groups": [[3], [2], [1], [0]]}, {"iteration_s": 1.02, "groups": [[3, 2, 1, 0]]},
             {"iteration_s": 1.50, "groups": []}]
    assert choose(table) is table[1]
    table[1]["iteration_s"] = 1.2  # no longer within the model's resolution
    assert choose(table) is table[0]
