"""The rules between `scalesgd train`'s options (each option's own check is declared with it): what an exchange,
a batch, a schedule and a dataset need of the others. Each reads a `TrainConfig` (which calls them from its
`validate`) and raises UsageError naming the options in backticks."""

from __future__ import annotations

import dataclasses
import os

from pathlib import Path

import torch

from scalesgd import checks
from scalesgd.comm.codecs import CODECS
from scalesgd.comm.codecs.registry import CODEC_OPTIONS, CROSS_NODE_SHARDS, SHARDED_ENGINE
from scalesgd.comm.cost.planner import NO_PLANNER
from scalesgd.comm.engine.exchange import exchange_names, parse_exchange
from scalesgd.data import DATASETS, DataError, check_text_file
from scalesgd.errors import UsageError
from scalesgd.models import IMAGE, MODELS, TEXT
from scalesgd.optim import early_freeze, variance_horizon
from scalesgd.options import field_default, flat_options, flatten, own_and_set, refuse, require_choice
from scalesgd.config.rules_periodic import periodic
from scalesgd.recipe.scaling import scaled_lr

MIN_PER_WORKER = 2  # BatchNorm needs more than one sample per worker
# top-k ρ 0.01 under AdamW on the language model against fp32, median of 3 seeds (docs/results.md#language-model)
SPARSE_ADAM_LOSS, SPARSE_ADAM_CORRECTED = "+8.3 %", "+2.1 %"
# the default GPT, batch 64, 2 workers, AdamW, on an AMD EPYC with AVX2 alone: 3.39 s a step against 0.33 s (2026-11-26)
EMULATED_BF16_SLOWDOWN = "10.3×"
# the default GPT, batch 64, 8 local workers: adamw's tokens a second ÷ muon's, median of 3, on an AMD EPYC whose
# torch runs AVX2 (no AVX512, so no bf16 in oneDNN: torch's Muon's Newton–Schulz in bf16 on a scalar path;
# docs/results.md#muon-cpu)
MUON_BF16_SLOWDOWN = "10.2×"


def dense_start(cfg) -> bool:
    """Whether `compress_after` leaves any dense step, whatever the epoch's length (where Adam's variance can settle
    before it is frozen)."""
    return cfg.compress_after_steps(1_000_000) > 0


def auto_problem(name: str) -> str | None:
    """Why --exchange auto cannot weigh the exchange `name`, or None."""
    engine, codec = parse_exchange(name)
    if codec not in CODECS or not CODECS[codec].runs_on(engine):
        return f"not an exchange; use one of {', '.join(exchange_names())}"
    if not CODECS[codec].simulated:
        return "the simulator has no cost model for it, so auto cannot rank it"
    if engine == "ddp" and CODECS[codec].torch_hook_needs_cuda and not torch.cuda.is_available():
        return "PyTorch's hook runs only on CUDA with NCCL, and this machine has no GPU"
    return None


def exchange(cfg) -> None:
    """`exchange` auto and its candidates, or the codec on its engine; the processes per node."""
    x, rt = cfg.exchange, cfg.runtime
    if x.sharded and x.auto and x.engine != SHARDED_ENGINE:
        raise UsageError(f"`exchange` auto chooses the codec on our sharded engine's sums; `engine` {x.engine} is "
                         f"FSDP2 as it comes: give `engine` {SHARDED_ENGINE}, or `codec` (its reduce-scatter's dtype)")
    if x.sharded:
        sharded(cfg)
    elif x.shard != "all":
        raise UsageError(f"`shard` {x.shard} lays out the sharded engine's shards: add `engine` {SHARDED_ENGINE}")
    if not x.auto and x.auto_codecs != field_default(type(x), "auto_codecs"):
        raise UsageError(f"`auto_codecs` {','.join(x.auto_codecs)} lists what `exchange` auto weighs: add `exchange` "
                         "auto, or drop it")
    if not x.auto and not x.auto_periodic:
        raise UsageError("--no-auto-periodic keeps `exchange` auto to per-step exchanges: add `exchange` auto, or drop "
                         "it")
    if cfg.periodic.on:
        periodic(cfg)
    else:
        for name, value in vars(cfg.periodic).items():
            if value != field_default(type(cfg.periodic), name):
                given = f"`{name}`" if value is True else f"`{name}` {value}"
                raise UsageError(f"{given} applies to periodic synchronisation: add `local_steps` H")
        if x.auto:
            auto(cfg)
        else:
            manual(cfg)
    if x.procs_per_node and rt.workers % x.procs_per_node:
        raise UsageError(f"`procs_per_node` {x.procs_per_node} does not divide `workers` {rt.workers}")
    if x.hybrid or cfg.replica_scope == "node":
        per_node = x.procs_per_node or node_size(rt.workers)
        if rt.workers // per_node < 2:
            what = "`shard` node shards within each node and sums across nodes" if not cfg.periodic.on else (
                "each node is one replica")
            raise UsageError(f"{what}, and the {rt.workers} workers are one node ({per_node} a node); give "
                             f"`procs_per_node` dividing them into 2 nodes or more (e.g. {max(1, rt.workers // 2)})")


def node_size(workers: int, environ=os.environ) -> int:
    """Processes a node runs where `procs_per_node` does not say: under torchrun its LOCAL_WORLD_SIZE, else all the
    local workers."""
    return int(environ.get("LOCAL_WORLD_SIZE", workers)) if checks.launched(environ) else workers


def auto(cfg) -> None:
    """`exchange` auto: no codec or buckets of the user's (auto picks them), candidates it can weigh, and at
    least one that fits the rest of the configuration as manual mode would run it."""
    x = cfg.exchange
    if x.planner != NO_PLANNER:
        raise UsageError(f"`planner` {x.planner}: with `exchange` auto the buckets are auto's choice")
    for name in ("codec", "buckets"):  # `engine` too is auto's choice: each candidate names its own
        value, default = getattr(x, name), field_default(type(x), name)
        if value != default:
            raise UsageError(f"`{name}` {value} with `exchange` auto: auto chooses the codec and buckets among "
                             f"`auto_codecs` (e.g. `auto_codecs` {x.codec},fp8); drop `{name}`, or drop `exchange` "
                             "auto to run it as given")
    for name in x.auto_candidates:
        problem = auto_problem(name)
        if problem:
            raise UsageError(f"`auto_codecs` {name}: {problem}")
    values, families = flatten(cfg), {CODECS[parse_exchange(name)[1]].family for name in x.auto_candidates}
    for flat in flat_options(type(cfg)):  # a family's own option needs one of its codecs among the candidates
        if own_and_set(flat, values) and flat.prefix not in families:
            raise UsageError(f"`{flat.name}` applies to the {flat.prefix} codecs, and `auto_codecs` lists none of them")
    fitting, dropped = auto_fitting(cfg)
    if not fitting:
        name, why = next(iter(dropped.items()))
        raise UsageError(f"no exchange in `auto_codecs` ({', '.join(dropped)}) fits this run as manual mode would run "
                         f"it; {name}: {why}")


def auto_fitting(cfg) -> tuple[tuple[str, ...], dict[str, str]]:
    """The exchanges `exchange` auto may choose — those of `auto_candidates` that manual mode would run with the rest
    of this configuration — and why each other one is left out."""
    fitting, dropped = [], {}
    for name in cfg.exchange.auto_candidates:
        problem = _candidate_problem(cfg, name)
        if problem:
            dropped[name] = problem
        else:
            fitting.append(name)
    return tuple(fitting), dropped


def _candidate_problem(cfg, name: str) -> str | None:
    """Why manual mode would refuse the exchange `name` with the rest of this configuration (other codec families'
    options at their defaults), or None."""
    engine, codec = parse_exchange(name)
    if cfg.exchange.sharded:  # the same codec, on the shards' sums
        if engine != "scalesgd":
            return f"DDP's exchange sums whole gradients; `engine` {cfg.exchange.engine} sums shards"
        engine = cfg.exchange.engine
    family, values = CODECS[codec].family, flatten(cfg)
    others = {flat.name: flat.field.default for flat in flat_options(type(cfg))
              if own_and_set(flat, values) and flat.prefix != family}
    trial = cfg.replaced(exchange="manual", engine=engine, codec=codec, **others)
    if trial.exchange.momentum_in_exchange != cfg.exchange.momentum_in_exchange:
        return (f"the optimizer leaves its momentum to the exchange (`momentum_correction`), which {codec} does not "
                "carry")
    try:
        manual(trial)
    except UsageError as err:
        return str(err)
    return None


def manual(cfg) -> None:
    """The codec on its engine, the planner, a codec family's own options, and what the codec needs of the
    optimizer and of the dense start."""
    r, x = cfg.recipe, cfg.exchange
    runs_here = [name for name, entry in CODECS.items() if entry.runs_on(x.codec_site)]
    if x.sharded and x.codec in CODECS and x.codec not in runs_here:
        entry, ours = CODECS[x.codec], ", ".join(runs_here)
        if x.engine == "fsdp2":
            elsewhere = " and ".join(e for e in ("scalesgd", "ddp", SHARDED_ENGINE) if entry.runs_on(e))
            raise UsageError(f"`codec` {x.codec}: `engine` fsdp2 is FSDP2 as it comes, its reduce-scatter in {ours}; "
                             f"{x.codec} runs with `engine` {elsewhere}")
        if entry.build is None:
            raise UsageError(f"`codec` {x.codec} is PyTorch's own DDP hook (`engine` ddp); with `engine` {x.engine} "
                             f"give one of {ours}")
        raise UsageError(f"`codec` {x.codec} groups whole gradients its own way (its buckets: {entry.buckets}), "
                         f"and `engine` {x.engine} sums each unit's gradients as one bucket: give one of {ours}")
    require_choice("codec", x.codec, runs_here, f" (with `engine` {x.engine})")
    if x.engine == "ddp" and x.codec_entry.torch_hook_needs_cuda and not torch.cuda.is_available():
        raise UsageError(f"`codec` {x.codec} with `engine` ddp is PyTorch's own hook, which runs only on CUDA with "
                         f"NCCL (this machine has no GPU); our {x.codec} runs anywhere: add `engine` scalesgd")
    if x.planner != NO_PLANNER and not (x.codec_entry.plannable and x.engine == "scalesgd"):
        plannable = " | ".join(name for name, entry in CODECS.items() if entry.plannable)
        raise UsageError(f"`planner` {x.planner} plans the groups of `codec` {plannable} (with `engine` "
                         f"scalesgd); got `codec` {x.codec}")
    values = flatten(cfg)
    for flat in flat_options(type(cfg)):  # a family's own option, on and not as by default, needs its codec
        if own_and_set(flat, values) and x.codec_entry.family != flat.prefix:
            family = ", ".join(name for name, entry in CODECS.items() if entry.family == flat.prefix)
            raise UsageError(f"`{flat.name}` applies to the {flat.prefix} codecs ({family}); "
                             f"got `codec` {x.codec}")
    entry = x.codec_entry
    needing = [name for name, e in CODECS.items() if e.optimizer is not None and e.optimizer == r.optimizer]
    if (entry.optimizer is not None and entry.optimizer != r.optimizer) or (needing and x.codec not in needing):
        optimizer, codecs = (entry.optimizer, x.codec) if entry.optimizer is not None else (
            r.optimizer, " | ".join(needing))
        raise UsageError(f"`optimizer` {optimizer} and `codec` {codecs} go together (the codec sends Adam's momentum, "
                         f"the optimizer steps with it); got `optimizer` {r.optimizer} with `codec` {x.codec}")
    if entry.beta1_option is not None and flatten(cfg)[entry.beta1_option] != r.betas[0]:
        raise UsageError(f"`{entry.beta1_option}` {flatten(cfg)[entry.beta1_option]} must equal the optimizer's β1 "
                         f"(`betas` {','.join(map(str, r.betas))}): the codec keeps the momentum the optimizer "
                         "steps with")
    if entry.dense_start and not dense_start(cfg):
        raise UsageError(f"`compress_after` {x.compress_after} leaves `codec` {x.codec} no dense warm-up: it "
                         "freezes Adam's variance at the warm-up's end; give STEPS, EPOCHSep or warmup (with a warmup)")
    if r.freeze_variance and (r.optimizer != "adamw" or not dense_start(cfg)):
        raise UsageError(f"`freeze_variance` freezes AdamW's variance where compression starts: it needs `optimizer` "
                         f"adamw and dense steps first (`compress_after`); got {r.optimizer} with "
                         f"`compress_after` {x.compress_after}")
    if x.codec_options["topk"].momentum_correction and r.optimizer == "muon":
        raise UsageError("`momentum_correction` moves the optimizer's momentum into the exchange, and muon "
                         "orthogonalises each weight matrix's own momentum before it steps: it needs `optimizer` sgd "
                         "with `momentum` above 0, or adamw with dense steps first (`compress_after`)")
    carried = (r.optimizer == "sgd" and r.momentum > 0
               or r.optimizer == "adamw" and dense_start(cfg))
    if x.codec_options["topk"].momentum_correction and not carried:
        raise UsageError(f"`momentum_correction` moves the optimizer's momentum into the exchange: it needs "
                         f"`optimizer` sgd with `momentum` above 0, or adamw with dense steps first (`compress_after`, "
                         f"where its variance is frozen); got {r.optimizer} with momentum {r.momentum} and "
                         f"`compress_after` {x.compress_after}")
    if x.codec_options["topk"].momentum_correction and r.optimizer == "adamw" and r.nesterov:
        raise UsageError("`nesterov` is momentum SGD's (sgd, lars); adamw takes Adam's moments")


def sharded(cfg) -> None:
    """`engine` scalesgd-fsdp or fsdp2: what the sharded engines do not run yet is refused, saying why."""
    r, engine = cfg.recipe, cfg.exchange.engine
    if cfg.periodic.on and cfg.exchange.codec_site != CROSS_NODE_SHARDS:
        raise UsageError(f"`local_steps` {cfg.periodic.local_steps} with `engine` {engine}: periodic synchronisation "
                         "of shards runs across nodes, each node one worker: add `shard` node with `engine` "
                         f"{SHARDED_ENGINE}")
    if cfg.periodic.on and cfg.periodic.peer:
        raise UsageError(f"`peer` {cfg.periodic.peer} synchronises whole models; drop it with `engine` {engine}")
    if r.optimizer == "muon":
        raise UsageError(f"`optimizer` muon orthogonalises each whole weight matrix, and `engine` {engine} steps "
                         "shards of them: give `engine` scalesgd or ddp, or `optimizer` adamw")
    if r.precision == "fp16":
        raise UsageError(f"`precision` fp16 with `engine` {engine}: a loss scaler over shards is not built; give bf16 "
                         "(FSDP's mixed precision: bf16 compute, fp32 shards) or fp32")
    if r.freeze_variance and cfg.exchange.codec_site != CROSS_NODE_SHARDS:
        raise UsageError("`freeze_variance` steps with 1-bit Adam's update for a sparse exchange, which the sharded "
                         f"engine runs only across nodes: add `shard` node with `engine` {SHARDED_ENGINE}")
    if cfg.measures_noise:
        raise UsageError("`noise_scale` and `lr_scaling` adascale read each rank's local gradient norm, which the "
                         "sharded engine does not keep; give `engine` scalesgd or ddp")


def batch(cfg) -> None:
    """The global batch against the workers, BN's samples per worker, what needs two workers."""
    d, r, rt, o = cfg.data, cfg.recipe, cfg.runtime, cfg.output
    for name, on in (("noise_scale", o.noise_scale), ("lr_scaling", r.lr_scaling == "adascale")):
        if on and rt.workers < 2:
            value = "" if name == "noise_scale" else " adascale"
            raise UsageError(f"`{name}`{value} compares each worker's gradient with the mean over workers: it "
                             f"needs `workers` 2 or more, got {rt.workers}")
    parts = rt.workers * r.accumulate
    if 0 < cfg.per_worker_batch < r.accumulate:
        raise UsageError(f"`accumulate` {r.accumulate} is more micro-batches than the {cfg.per_worker_batch} "
                         f"sample(s) each worker has a step (`batch_size` {r.batch_size} over `workers` "
                         f"{rt.workers}); use 1..{cfg.per_worker_batch}, dividing it")
    if r.batch_size % parts:
        split = f"`workers` {rt.workers}" + (f" × `accumulate` {r.accumulate}" if r.accumulate > 1 else "")
        raise UsageError(f"`batch_size` {r.batch_size} does not divide evenly by {split}; use a multiple of {parts}")
    least = 1 if d.text else MIN_PER_WORKER  # BatchNorm needs two samples; a language model one sequence
    if cfg.micro_batch < least:
        raise UsageError(f"`batch_size` {r.batch_size} gives {cfg.micro_batch} sample(s) per worker and "
                         f"micro-batch; BatchNorm needs at least {least}")
    if r.bn_batch and (r.bn_batch < MIN_PER_WORKER or cfg.micro_batch % r.bn_batch):
        raise UsageError(f"`bn_batch` {r.bn_batch}: must divide the {cfg.micro_batch} samples per worker and "
                         f"micro-batch and be at least {MIN_PER_WORKER} (0: BN over each micro-batch)")
    if r.nesterov and r.momentum == 0:
        raise UsageError("`nesterov` needs `momentum` above 0")
    if r.nesterov and r.optimizer == "lamb":
        raise UsageError("`nesterov` is momentum SGD's (sgd, lars); lamb takes Adam's moments")
    if r.nesterov and r.optimizer == "muon":
        raise UsageError("`nesterov` is momentum SGD's (sgd, lars); muon's matrices take torch Muon's Nesterov "
                         "momentum 0.95 always, the rest Adam's moments")


def schedule(cfg) -> None:
    """The scaled rate, the warmup, the milestones and the ends of the decay."""
    r = cfg.recipe
    peak = scaled_lr(r.base_lr, r.batch_size, r.base_batch, r.lr_scaling)
    if not 0 < peak <= checks.FLOAT32_MAX:  # the schedule divides by it; the optimizer holds it as a float32
        raise UsageError(f"`base_lr` {r.base_lr} scaled for `batch_size` {r.batch_size} from `base_batch` "
                         f"{r.base_batch} ({r.lr_scaling}) gives {peak:g}; the rate must be positive and "
                         "finite")
    if r.warmup != "none" and r.lr_scaling != "adascale" and not 0 <= r.warmup_epochs <= r.epochs:
        raise UsageError(f"`warmup_epochs` {r.warmup_epochs} is longer than training (`epochs` {r.epochs}); "
                         f"use 0..{r.epochs} or `warmup` none")
    peak = r.lr_schedule().peak
    factor = r.lr_factor(peak, 1)
    milestones = factor.milestones
    if any(not 0 < m <= r.epochs for m in milestones) or list(milestones) != sorted(milestones):
        raise UsageError(f"`milestones` {','.join(f'{m:g}' for m in milestones)}: must be increasing epochs in "
                         f"(0, {r.epochs}]")
    if not 0 <= factor.arccot_epoch <= r.epochs:
        raise UsageError(f"`arccot_epoch` {r.arccot_epoch}: must be in 0..{r.epochs} (`epochs`)")
    if not 0 <= r.end_lr < peak:
        raise UsageError(f"`end_lr` {r.end_lr}: must be >= 0 and below the scaled rate {peak:g}")


def data(cfg) -> None:
    """The dataset's files, its size against the batch, its memory in every worker."""
    d, m, r, rt = cfg.data, cfg.model, cfg.recipe, cfg.runtime
    dataset = DATASETS[d.dataset]
    wanted = TEXT if dataset.text else IMAGE
    if MODELS[m.name].data != wanted:
        fits = ", ".join(name for name, entry in MODELS.items() if entry.data == wanted)
        raise UsageError(f"`model` {m.name} does not read the {wanted} of `dataset` {d.dataset}; use {fits}")
    if d.data_file is not None:
        if not dataset.text:
            raise UsageError(f"`data_file` is a text to train a language model on: it needs `dataset` text, got "
                             f"{d.dataset}")
        try:
            check_text_file(d.data_file, m.options["gpt"].block)
        except DataError as err:
            raise UsageError(f"`data_file` {d.data_file}: {err}") from None
    refuse("gpt_width", m.options["gpt"].width, m.options["gpt"].problem())
    if d.dataset != "imagefolder":
        for name in ("skip_bad_images", "loader_workers"):
            if getattr(d, name) not in (None, False):
                raise UsageError(f"`{name}` is for images streamed from a folder: it needs `dataset` imagefolder, "
                                 f"got {d.dataset}")
    if dataset.check_dir is not None:
        if not d.data_dir:
            raise UsageError(f"`dataset` {d.dataset} needs `data_dir`: the folder holding {dataset.files}")
        try:
            dataset.check_dir(d.data_dir)
        except DataError as err:
            raise UsageError(str(err)) from None
    if r.batch_size > cfg.train_size():
        raise UsageError(f"`batch_size` {r.batch_size} is larger than the {d.dataset} training set "
                         f"({cfg.train_size()} samples)")
    if dataset.memory is not None:  # every worker holds its own copy
        copies = checks.processes_here(rt.workers)
        problem = checks.fits_in_memory(dataset.memory(cfg.data_request()) * copies)
        refuse("samples", d.samples, problem and f"the {d.dataset} data of {d.side}×"
               f"{d.side} images in each of {copies} worker(s): {problem}; use fewer `samples`, a "
               "smaller `image_size` or fewer `workers`")


def variance_freeze(cfg) -> int | None:
    """The step where this run freezes Adam's variance (1-bit Adam, `freeze_variance`, Adam's momentum in the
    exchange), counted in the epochs the training set gives; None where it freezes none."""
    return cfg.compress_after_steps(max(cfg.train_size() // cfg.recipe.batch_size, 1)) if cfg.freezes_variance \
        else None


def native_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (AVX512-BF16 or AMX); True where its flags cannot be read."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def onednn_bf16() -> bool:
    """Whether oneDNN computes bf16 matrix products on this CPU (AVX512 and up): where not, torch falls back to a
    scalar path many times slower than fp32's."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def advice(cfg) -> list[str]:
    """What a valid configuration is known to lose, and what to add instead (warnings, naming options)."""
    r, x = cfg.recipe, cfg.exchange
    found = [f"`exchange` auto leaves out {name}: {why}" for name, why in auto_fitting(cfg)[1].items()] if x.auto \
        else []
    freeze = variance_freeze(cfg)
    if freeze is not None and early_freeze(freeze, r.betas[1]):
        found.append(f"`compress_after` {x.compress_after} ({freeze} steps): {early_freeze(freeze, r.betas[1])} "
                     f"(`compress_after` {variance_horizon(r.betas[1])})")
    if r.precision == "bf16" and not torch.cuda.is_available() and not native_bf16():
        found.append(f"`precision` bf16 on this CPU, which has no native bf16 (AVX512-BF16 or AMX), is emulated: "
                     f"measured {EMULATED_BF16_SLOWDOWN} slower a step than fp32; train in fp32 here, in bf16 on a GPU")
    hidden_matrices = MODELS[cfg.model.name].data == TEXT  # a CNN's hidden weights are 4-D: AdamW's, not Muon's
    if r.optimizer == "muon" and hidden_matrices and not torch.cuda.is_available() and not onednn_bf16():
        found.append(f"`optimizer` muon on this CPU ({torch.backends.cpu.get_cpu_capability()}, no bf16 in oneDNN): "
                     f"torch's Muon orthogonalises in bf16, here on a scalar path: measured {MUON_BF16_SLOWDOWN} "
                     "fewer tokens a second than adamw with 8 workers; adamw here, muon on a GPU or an AVX512 CPU")
    sparse_gradient = x.codec_entry.sparse and not cfg.periodic.on  # periodic: it carries the pseudo-gradient
    if r.optimizer == "adamw" and sparse_gradient and not x.codec_options["topk"].momentum_correction:
        carries = x.codec_entry.family is not None and "momentum_correction" in {
            f.name for f in dataclasses.fields(CODEC_OPTIONS[x.codec_entry.family])}  # its family's own option
        instead = (f"`momentum_correction` carries Adam's momentum instead ({SPARSE_ADAM_CORRECTED}; docs/hooks.md)"
                   if carries else "send it as a pseudo-gradient every few steps instead (`local_steps`)")
        found.append(f"`codec` {x.codec} under `optimizer` adamw sends the gradient in rare spikes that inflate "
                     f"Adam's variance (measured: validation loss {SPARSE_ADAM_LOSS} with topk); {instead}")
    return found
