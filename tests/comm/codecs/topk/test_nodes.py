"""Top-k across nodes only: dense inside a node, sparse between nodes, on 2 nodes × 2 processes."""

import math

import torch
import torch.distributed as dist

from scalesgd.comm.codecs import BucketView, Channel, NodeTopkCodec
from scalesgd.comm.wire.compact import compact_size
from scalesgd.comm.wire.topology import Topology
from tests.comm.exchanging import exchange
from tests.spawn_util import run_workers

N = 1001  # odd: the two shards differ in size


def exchanged(rank, world, density, poison=False, wire="plain"):
    groups = Topology(world, rank, 2).groups()
    channel = Channel(dist.new_group(), world, topology=groups)
    codec = NodeTopkCodec("topk-nodes", density, reuse=1, wire=wire)
    grad = torch.randn(N, generator=torch.Generator().manual_seed(rank))
    if poison and rank == 3:
        grad[7] = math.inf
    flat = grad.clone()
    sent = exchange(codec, flat, BucketView(0, [], [0], N), channel)
    mean = grad.clone()
    dist.all_reduce(mean)
    return flat, mean / world, sent, codec.cross_node_bytes


def test_at_full_density_it_is_the_mean_on_every_rank():
    ranks = run_workers(exchanged, 4, 1.0)
    for flat, mean, _, _ in ranks:
        assert torch.allclose(flat, mean, atol=1e-6)
        assert torch.equal(flat, ranks[0][0])


def test_between_nodes_only_each_shards_top_values_travel():
    ranks = run_workers(exchanged, 4, 0.01)
    assert all(torch.equal(flat, ranks[0][0]) for flat, *_ in ranks)
    sent_across = [cross for *_, cross in ranks]
    # shards of 501 and 500 entries: 6 and 5 (index, value) pairs of 8 bytes to the one other node, and the
    # lengths of both parts and the flag, 24 bytes
    assert sent_across == [6 * 8 + 24, 5 * 8 + 24] * 2
    compact = [cross for *_, cross in run_workers(exchanged, 4, 0.01, False, "compact")]
    assert compact == [compact_size(6, 501) + 16, compact_size(5, 500) + 16] * 2  # one message: its length, a flag
    flat, mean = ranks[0][0], ranks[0][1]
    sent = flat != 0
    assert 10 <= int(sent.sum()) <= 22  # each node's top entries of each shard
    assert (flat[sent] - mean[sent]).abs().max() < mean.abs().max()  # the sent ones near the mean


def test_an_inf_on_one_rank_is_non_finite_on_every_rank():
    for flat, *_ in run_workers(exchanged, 4, 0.01, True):
        assert not torch.isfinite(flat[:501]).all()


def train_both(rank, world):
    from torch.nn.parallel import DistributedDataParallel

    from scalesgd.comm.codecs import CodecSettings, TopkOptions, make_codec
    from scalesgd.comm.engine.optimizer import DistributedOptimizer
    from tests.comm.engine.test_optimizer import _train, relative_distance

    groups = Topology(world, rank, 2).groups()
    reference = _train(rank, world, lambda m, o: (DistributedDataParallel(m), o))
    got = _train(rank, world, lambda m, o: (m, DistributedOptimizer(
        o, m, codec=make_codec("topk-nodes", CodecSettings(TopkOptions(density=1.0))), topology=groups)))
    return relative_distance(got, reference)


def test_at_full_density_training_through_the_engine_matches_ddp():
    assert all(distance < 1e-5 for distance in run_workers(train_both, 4))
