"""`scalesgd train`'s exchange options: the engine, the codec and its family's options, the allreduce, the buckets,
when compression starts, and `--exchange auto`'s candidates; and what they build: the codec's settings and the
`ExchangeSetup` the engines take."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from scalesgd import checks
from scalesgd.comm.codecs import CODEC_OPTIONS, CODECS, CodecEntry, CodecOptions, CodecSettings
from scalesgd.comm.codecs.registry import CROSS_NODE_SHARDS, SHARDED_ENGINE
from scalesgd.comm.cost.planner import NO_PLANNER, PLANNERS
from scalesgd.comm.engine.buckets import spec_problem
from scalesgd.comm.engine.exchange import ENGINES, SHARDED, ExchangeSetup, exchange_names, parse_exchange
from scalesgd.comm.wire.collectives import ALGORITHMS
from scalesgd.options import expanded, option, words
from scalesgd.trace import Tracer

EXCHANGES = ("manual", "auto")
SHARDING = ("all", "node")  # the sharded engines: over every rank, or within each node (hybrid: replicated across)
MAX_DENSE = 1_000_000_000  # dense steps or epochs before compression: past any run, and an int64 once multiplied
# what --exchange auto weighs unless told: the exchanges that keep fp32's accuracy, ours and PyTorch's DDP's (ddp-bf16
# where CUDA runs it). The low-rank and sparse ones change what is learned (PyTorch's PowerSGD hook: +6.9 % validation
# loss on the language model under AdamW, top-k ρ 0.01 +8.3 %, docs/results.md#language-model), so auto weighs them
# only when listed: `--auto-codecs fp32,fp8,lowrank-acp,ddp,ddp-powersgd`.
AUTO_CODECS = ("fp32", "fp16", "bf16", "fp8", "ddp", "ddp-fp16", "ddp-bf16")


def _cuda_only(exchange: str) -> bool:
    """Whether an exchange is PyTorch's hook that runs only on CUDA with NCCL (DDP's bf16)."""
    engine, codec = parse_exchange(exchange)
    return engine == "ddp" and CODECS[codec].torch_hook_needs_cuda


def _steps_or_epochs(text: str) -> str | None:
    """What is wrong with a --compress-after value (STEPS, EPOCHSep or warmup), or None."""
    try:
        value = float(text[:-2]) if text.endswith("ep") else int(text) if text != "warmup" else 0
    except ValueError:
        return "give STEPS, EPOCHSep (e.g. 2ep) or warmup"
    if not (value >= 0 and math.isfinite(value)):
        return "must be >= 0 and finite"
    return None if value <= MAX_DENSE else f"must be at most {MAX_DENSE:,} (steps or epochs)"


@dataclass
class ExchangeConfig:
    """How a run's gradients travel between its workers."""

    engine: str = option("ddp", "gradient exchange: PyTorch's as it comes, DDP (ddp) or FSDP2 sharding "
                         "parameters, gradients and optimizer state (fsdp2: its own reduce-scatter in the codec's "
                         "dtype), or ours: whole models (scalesgd) or FSDP2's shards with the codec on their "
                         "reduce-scatter (scalesgd-fsdp; its earlier name fsdp still works)", choices=ENGINES)
    codec: str = option("fp32", "what travels; with ddp, fp16/bf16/powersgd are PyTorch's own comm hooks, the "
                        "others ours", choices=CODECS, check_choices=False)
    algorithm: str = option("ring", "scalesgd engine's allreduce", choices=ALGORITHMS)
    buckets: str = option("size:1", "scalesgd engine's bucket plan: size:MB | growing[:FIRST_MB[:FACTOR]] | layer "
                          "| single", check=spec_problem)
    shard: str = option("all", "the sharded engines: shard over every rank (all), or within each node and "
                        "replicate across nodes (node: hybrid sharding; 2 nodes or more; the node's reduce-scatter in "
                        "fp32, each shard's sum across nodes, or with --local-steps each node's DiLoCo round, "
                        "through the codec)", choices=SHARDING)
    procs_per_node: int = option(0, "processes per node for hierarchical exchange", shown_default="LOCAL_WORLD_SIZE",
                                 check=checks.at_least(0, "0 reads LOCAL_WORLD_SIZE"))
    compress_after: str = option("warmup", "a lossy codec compresses after this many dense (fp32) steps: STEPS, "
                                 "EPOCHSep, or warmup: the end of the LR warmup, and where Adam's variance is frozen "
                                 "there (1-bit Adam, --freeze-variance, --momentum-correction), no earlier than its "
                                 "averaging horizon 1/(1 − β2) steps", check=_steps_or_epochs)
    mode: str = option("manual", "auto: at start-up measure the compute, the link and each exchange of "
                       "--auto-codecs on this process group, simulate each with every bucket plan (and the periodic "
                       "modes bench quality measured), rank them by predicted time to the target quality, try the "
                       "closest for real, and use the soonest (engine and codec: ours or DDP's); manual: --engine, "
                       "--codec and --buckets as given", choices=EXCHANGES, key="exchange")
    auto_codecs: tuple[str, ...] = option(AUTO_CODECS, "the exchanges --exchange auto weighs: our codecs by name, "
                                          "ddp (DDP's fp32 allreduce) and ddp-CODEC (DDP with PyTorch's fp16, bf16 or "
                                          "PowerSGD hook, or ours); low-rank and sparse ones only when listed; "
                                          "ddp-bf16 is left out without CUDA", parse=words, choices=exchange_names,
                                          check=checks.distinct)
    auto_periodic: bool = option(True, "--exchange auto weighs per-step exchanges only (by default it also weighs "
                                 "periodic synchronisation where bench quality measured a mode reaching the target "
                                 "with a codec of --auto-codecs and this run's recipe)", flag="--no-auto-periodic")
    codec_options: CodecOptions = expanded(CODEC_OPTIONS.items, CodecOptions, lambda held, family: held[family],
                                           group="codec options: {}")  # each family's, --FAMILY-OPTION
    planner: str = option(NO_PLANNER, "sparse codecs: merge layers into groups from a measured timing model, "
                          "greedily (dlgs) or exactly (optimal); none: --buckets decides",
                          choices=lambda: (NO_PLANNER, *PLANNERS))

    @property
    def codec_entry(self) -> CodecEntry:
        return CODECS[self.codec]

    @property
    def auto(self) -> bool:
        """Whether `--exchange auto` chooses the engine, codec and buckets at start-up."""
        return self.mode == "auto"

    @property
    def auto_candidates(self) -> tuple[str, ...]:
        """The exchanges --exchange auto weighs here: --auto-codecs, less PyTorch's CUDA-only hooks without CUDA
        and DDP's under the sharded engine when the list is the default one (a list given names only what runs,
        `rules.exchange`)."""
        if self.auto_codecs != AUTO_CODECS:
            return self.auto_codecs
        if self.sharded:  # the default list under the sharded engine: our codecs (DDP's do not sum shards)
            return tuple(c for c in self.auto_codecs if parse_exchange(c)[0] != "ddp")
        return tuple(c for c in self.auto_codecs if torch.cuda.is_available() or not _cuda_only(c))

    @property
    def needs_topology(self) -> bool:
        """Whether workers build the node / cross-node groups (hierarchical allreduce, two-stage fp8, and any codec
        --exchange auto may choose)."""
        codecs = [parse_exchange(c)[1] for c in self.auto_candidates] if self.auto else (self.codec,)
        return (ALGORITHMS[self.algorithm].needs_topology and self.engine == "scalesgd"
                or self.hybrid or any(CODECS[c].needs_topology for c in codecs))

    @property
    def hybrid(self) -> bool:
        """Whether the sharded engine shards within each node and sums across nodes (FSDP2's hybrid layout)."""
        return self.sharded and self.shard == "node"

    @property
    def codec_site(self) -> str:
        """Where the codec runs: in the engine's exchange, or, where ours shards within each node, in the cross-node
        sum of the shards (`CROSS_NODE_SHARDS`: any codec of ours; FSDP2 as it comes sums in its reduce dtype)."""
        return CROSS_NODE_SHARDS if self.hybrid and self.engine == SHARDED_ENGINE else self.engine

    @property
    def sharded(self) -> bool:
        """Whether the engine shards the model (FSDP2), with the codec on its reduce-scatter or as it comes."""
        return self.engine in SHARDED

    @property
    def momentum_in_exchange(self) -> bool:
        """Whether the exchange carries the optimizer's momentum (DGC's momentum correction): the optimizer leaves it
        out, so only an exchange that carries it may run."""
        return self.codec_options["topk"].momentum_correction

    @property
    def own_group(self) -> bool:
        """Whether the exchange runs in a process group of its own, created at start-up."""
        return self.auto or ENGINES[self.engine].uses_own_group(self.codec_entry)

    @property
    def planned(self) -> bool:
        """Whether the buckets come from the planner, measured at start-up."""
        return self.planner != NO_PLANNER

    def compress_after_steps(self, steps_per_epoch: int, warmup_steps: int) -> int:
        """The dense steps before compression, from STEPS, EPOCHSep or warmup (the rate's `warmup_steps`)."""
        if self.compress_after == "warmup":
            return warmup_steps
        if self.compress_after.endswith("ep"):
            return round(float(self.compress_after[:-2]) * steps_per_epoch)
        return int(self.compress_after)

    def codec_settings(self, seed: int, steps_per_epoch: int, momentum: float, nesterov: bool,
                       momentum_average: bool, local_steps: int = 1) -> CodecSettings:
        """What this run's codecs are built with: each family's options, and the run's seed, epoch, the
        optimizer's momentum (an average of the gradients where `momentum_average`: Adam's β1) and the steps
        between its exchanges."""
        return CodecSettings(self.codec_options, seed=seed, steps_per_epoch=steps_per_epoch, momentum=momentum,
                             nesterov=nesterov, momentum_average=momentum_average, local_steps=local_steps)

    def setup(self, settings: CodecSettings, dense_steps: int, precision: str, group=None, topology=None,
              tracer: Tracer | None = None, plan=None, norms=None) -> ExchangeSetup:
        """How the gradients travel, in the given groups (`plan`: the planner's buckets; `norms`: where the squared
        gradient norms are counted)."""
        return ExchangeSetup(self.codec, settings, dense_steps, self.algorithm, plan or self.buckets, group, topology,
                             tracer or Tracer(), norms, precision)
