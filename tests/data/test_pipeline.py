"""The pipeline a step reads: streamed folders keep the sampler's guarantees, and resume mid-epoch exactly."""

import pytest
import torch

from scalesgd.data import GlobalBatchSampler, LoaderSettings, default_loader_workers, load_bundle, load_image_folder
from scalesgd.data.imagefolder.trees import write_fake_tree
from scalesgd.data.pipeline import EpochBatches, MemoryPipeline, loader, open_pipeline

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    write_fake_tree(root, 3, 7, (24, 20), val_per_class=2)
    return load_image_folder(root, 12, seed=1)


def test_each_epoch_every_file_is_read_once_by_one_rank_through_the_loader_processes(data):
    world, read = 2, {}
    for epoch in (0, 1):
        for rank in range(world):
            sampler = GlobalBatchSampler(len(data.train), 6, world, rank, seed=1)
            sampler.set_epoch(epoch)
            files = loader(data.train, LoaderSettings(1, CPU), batch_sampler=EpochBatches(sampler))
            read[epoch, rank] = [data.train.files[i][0] for batch in files for i in batch.indices.tolist()]
        both = read[epoch, 0] + read[epoch, 1]
        assert sorted(both) == sorted(p for p, _ in data.train.files)  # every file once
        assert not set(read[epoch, 0]) & set(read[epoch, 1])  # no overlap
    assert read[0, 0] != read[1, 0]  # one new shuffle per epoch


def test_a_pipeline_started_mid_epoch_reads_exactly_the_rest_of_the_epoch(data):
    def steps(workers: int, start: int) -> list:
        sampler = GlobalBatchSampler(len(data.train), 6, 2, 1, seed=1)
        sampler.set_epoch(3)
        pipeline = open_pipeline(data, sampler, 2, LoaderSettings(workers, CPU))
        try:
            return [[(x.clone(), y.clone()) for x, y in parts] for parts in pipeline.steps(start)]
        finally:
            pipeline.close()

    whole, resumed = steps(0, 0), steps(2, 2)  # another number of loader processes: the same crops
    assert len(resumed) == len(whole) - 2 and len(whole[0]) == 2  # two micro-batches a step
    for a, b in zip(whole[2:], resumed):
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    x = torch.cat([x for parts in whole for x, _ in parts])
    assert x.dtype == torch.float32 and abs(x.mean().item()) < 0.5  # normalised on the device


def test_an_epoch_prepared_ahead_is_being_decoded_before_its_first_step_and_reads_the_same_batches(data):
    def epoch_two(prepare: bool) -> list:
        sampler = GlobalBatchSampler(len(data.train), 6, 2, 0, seed=1)
        pipeline = open_pipeline(data, sampler, 1, LoaderSettings(2, CPU))
        try:
            list(pipeline.steps(0))  # epoch 0, as training reads it
            if prepare:
                pipeline.prepare(2)
                assert pipeline.started[1]._send_idx == min(2 * 2, len(sampler))  # handed out ahead, 2 a process
            sampler.set_epoch(2)  # what the training loop does at the epoch's start
            return [x.clone() for (x, _), in pipeline.steps(0)]
        finally:
            pipeline.close()

    ahead, asked = epoch_two(True), epoch_two(False)
    assert len(ahead) == len(asked) and all(torch.equal(a, b) for a, b in zip(ahead, asked))


def test_the_memory_pipeline_cuts_the_tensors_as_the_sampler_says():
    bundle = load_bundle("digits")
    sampler = GlobalBatchSampler(len(bundle.train), 64, 2, 0, seed=0)
    pipeline = MemoryPipeline(bundle, sampler, 2, CPU, 100)
    first = next(pipeline.steps(0))
    indices = torch.tensor(next(iter(sampler)))
    assert torch.equal(torch.cat([x for x, _ in first]), bundle.train.x[indices])
    shards = [list(pipeline.test_batches(rank, 2)) for rank in range(2)]
    assert sum(len(y) for shard in shards for _, y in shard) == len(bundle.test)


@pytest.mark.parametrize("local, cores, expected", [(2, 2, 1), (2, 16, 7), (8, 96, 11), (1, 1, 1)])
def test_loader_workers_default_to_the_cores_training_leaves_free(local, cores, expected):
    assert default_loader_workers(local, cores) == expected



@pytest.mark.cuda
def test_on_a_gpu_batches_are_normalised_on_the_device_and_equal_the_cpu_ones(data):
    def first_step(device: torch.device) -> list:
        sampler = GlobalBatchSampler(len(data.train), 6, 1, 0, seed=1)
        pipeline = open_pipeline(data, sampler, 1, LoaderSettings(1, device))
        try:
            return next(pipeline.steps(0))
        finally:
            pipeline.close()

    (x, y), = first_step(torch.device("cuda"))
    (x_cpu, y_cpu), = first_step(CPU)
    assert x.is_cuda and y.is_cuda
    torch.testing.assert_close(x.cpu(), x_cpu)
    assert torch.equal(y.cpu(), y_cpu)
