"""`scalesgd bench …`: measurements against PyTorch's baselines, each writing JSON, Markdown and a PNG."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scalesgd.bench import accuracy, allreduce, codec, faults, fp8_range, link, optimizer, train
from scalesgd.registry import Registry


@dataclass(frozen=True)
class Bench:
    """A benchmark: its config (its options), what runs it, and where it runs."""

    config: type
    run: Callable[..., int]
    help: str
    on_workers: bool  # True: on several workers (started here, or joined under torchrun); False: in this process
    description: str = ""


BENCHES: Registry[Bench] = Registry("benchmark")
BENCHES.add("allreduce", Bench(allreduce.AllreduceBenchConfig, allreduce.run,
                               "time and bus bandwidth of each allreduce algorithm against size", True))
BENCHES.add("train", Bench(train.TrainBenchConfig, train.run,
                           "iteration time of each exchange mode against DDP, side by side", True))
BENCHES.add("codec", Bench(codec.CodecBenchConfig, codec.run,
                           "fp8 kernel throughput, fused (torch.compile) against eager, one process", False))
BENCHES.add("fp8-range", Bench(fp8_range.Fp8RangeBenchConfig, fp8_range.run,
                               "fp8's range settings (quantile × headroom) on real gradients: error, clipping, "
                               "flushing", False))
BENCHES.add("optimizer", Bench(optimizer.OptimizerBenchConfig, optimizer.run,
                               "time of one optimizer step(), LARS against torch's SGD, one process", False))
BENCHES.add("accuracy", Bench(accuracy.AccuracyBenchConfig, accuracy.run,
                              "final test accuracy of training variants, median over seeds", False,
                              "Run `scalesgd train` for every variant × seed, one after another; options after -- "
                              "go to every run. Finished runs are kept and cut-short runs resumed when the same "
                              "command runs again."))
BENCHES.add("link", Bench(link.LinkBenchConfig, link.run,
                          "throughput and round trip between node 0 and node 1 (run it in the testbed)", True))
BENCHES.add("faults", Bench(faults.FaultsBenchConfig, faults.run,
                            "faults injected into short training runs: seconds to the end and whether the outcome "
                            "is the promised one", False))
