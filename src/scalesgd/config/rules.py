"""The rules between `scalesgd train`'s options (each option's own check is declared with it): what an exchange,
a batch, a schedule and a dataset need of the others. Each reads a `TrainConfig` (which calls them from its
`validate`) and raises UsageError naming the options in backticks."""

from __future__ import annotations

import torch

from scalesgd import checks
from scalesgd.comm.codecs import CODECS
from scalesgd.comm.engine.exchange import exchange_names, parse_exchange
from scalesgd.data import DATASETS, DataError, check_text_file
from scalesgd.errors import UsageError
from scalesgd.models import IMAGE, MODELS, TEXT
from scalesgd.options import flat_options, flatten, refuse, require_choice
from scalesgd.recipe.scaling import scaled_lr

MIN_PER_WORKER = 2  # BatchNorm needs more than one sample per worker
# top-k ρ 0.01 under AdamW on the language model against fp32, median of 3 seeds (docs/results.md#language-model)
SPARSE_ADAM_LOSS, SPARSE_ADAM_CORRECTED = "+8.3 %", "+2.1 %"
NO_PLANNER = "none"


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
    """`exchange` auto, the codec on its engine, the planner, a codec family's own options."""
    if cfg.exchange == "auto":
        if cfg.planner != NO_PLANNER:
            raise UsageError(f"`planner` {cfg.planner}: with `exchange` auto the buckets are auto's choice")
        for name in cfg.auto_candidates:
            problem = auto_problem(name)
            if problem:
                raise UsageError(f"`auto_codecs` {name}: {problem}")
    runs_here = [name for name, entry in CODECS.items() if entry.runs_on(cfg.engine)]
    require_choice("codec", cfg.codec, runs_here, f" (with `engine` {cfg.engine})")
    if cfg.engine == "ddp" and cfg.codec_entry.torch_hook_needs_cuda and not torch.cuda.is_available():
        raise UsageError(f"`codec` {cfg.codec} with `engine` ddp is PyTorch's own hook, which runs only on CUDA with "
                         f"NCCL (this machine has no GPU); our {cfg.codec} runs anywhere: add `engine` scalesgd")
    if cfg.planner != NO_PLANNER and not (cfg.codec_entry.plannable and cfg.engine == "scalesgd"):
        plannable = " | ".join(name for name, entry in CODECS.items() if entry.plannable)
        raise UsageError(f"`planner` {cfg.planner} plans the groups of `codec` {plannable} (with `engine` "
                         f"scalesgd); got `codec` {cfg.codec}")
    values = flatten(cfg)
    for flat in flat_options(type(cfg)):  # a family's own option, on and not as by default, needs its codec
        value = values[flat.name]
        if flat.field.metadata["own"] and value and value != flat.field.default \
                and cfg.codec_entry.family != flat.prefix:
            family = ", ".join(name for name, entry in CODECS.items() if entry.family == flat.prefix)
            raise UsageError(f"`{flat.name}` applies to the {flat.prefix} codecs ({family}); "
                             f"got `codec` {cfg.codec}")
    if (cfg.optimizer == "onebit-adam") != (cfg.codec == "onebit"):
        raise UsageError(f"`optimizer` onebit-adam and `codec` onebit go together (the codec sends Adam's momentum, "
                         f"the optimizer steps with it); got `optimizer` {cfg.optimizer} with `codec` {cfg.codec}")
    if cfg.codec == "onebit":
        onebit = cfg.codec_options["onebit"]
        if onebit.beta1 != cfg.betas[0]:
            raise UsageError(f"`onebit_beta1` {onebit.beta1} must equal the optimizer's β1 (`betas` "
                             f"{','.join(map(str, cfg.betas))}): the codec keeps the momentum the optimizer steps with")
        if not dense_start(cfg):
            raise UsageError(f"`compress_after` {cfg.compress_after} leaves 1-bit Adam no dense warm-up: its variance "
                             "is frozen at the warm-up's end; give STEPS, EPOCHSep or warmup (with a warmup)")
    if cfg.freeze_variance and (cfg.optimizer != "adamw" or not dense_start(cfg)):
        raise UsageError(f"`freeze_variance` freezes AdamW's variance where compression starts: it needs `optimizer` "
                         f"adamw and dense steps first (`compress_after`); got {cfg.optimizer} with "
                         f"`compress_after` {cfg.compress_after}")
    carried = (cfg.optimizer == "sgd" and cfg.momentum > 0
               or cfg.optimizer == "adamw" and dense_start(cfg))
    if cfg.topk.momentum_correction and not carried:
        raise UsageError(f"`momentum_correction` moves the optimizer's momentum into the exchange: it needs "
                         f"`optimizer` sgd with `momentum` above 0, or adamw with dense steps first (`compress_after`, "
                         f"where its variance is frozen); got {cfg.optimizer} with momentum {cfg.momentum} and `compress_after` "
                         f"{cfg.compress_after}")
    if cfg.topk.momentum_correction and cfg.optimizer == "adamw" and cfg.nesterov:
        raise UsageError("`nesterov` is momentum SGD's (sgd, lars); adamw takes Adam's moments")
    if cfg.procs_per_node and cfg.workers % cfg.procs_per_node:
        raise UsageError(f"`procs_per_node` {cfg.procs_per_node} does not divide `workers` {cfg.workers}")


def batch(cfg) -> None:
    """The global batch against the workers, BN's samples per worker, what needs two workers."""
    for name, on in (("noise_scale", cfg.noise_scale), ("lr_scaling", cfg.lr_scaling == "adascale")):
        if on and cfg.workers < 2:
            value = "" if name == "noise_scale" else " adascale"
            raise UsageError(f"`{name}`{value} compares each worker's gradient with the mean over workers: it "
                             f"needs `workers` 2 or more, got {cfg.workers}")
    parts = cfg.workers * cfg.accumulate
    if cfg.batch_size % parts:
        split = f"`workers` {cfg.workers}" + (f" × `accumulate` {cfg.accumulate}" if cfg.accumulate > 1 else "")
        raise UsageError(f"`batch_size` {cfg.batch_size} does not divide evenly by {split}; use a multiple of {parts}")
    least = 1 if cfg.text else MIN_PER_WORKER  # BatchNorm needs two samples; a language model one sequence
    if cfg.micro_batch < least:
        raise UsageError(f"`batch_size` {cfg.batch_size} gives {cfg.micro_batch} sample(s) per worker and "
                         f"micro-batch; BatchNorm needs at least {least}")
    if cfg.bn_batch and (cfg.bn_batch < MIN_PER_WORKER or cfg.micro_batch % cfg.bn_batch):
        raise UsageError(f"`bn_batch` {cfg.bn_batch}: must divide the {cfg.micro_batch} samples per worker and "
                         f"micro-batch and be at least {MIN_PER_WORKER} (0: BN over each micro-batch)")
    if cfg.nesterov and cfg.momentum == 0:
        raise UsageError("`nesterov` needs `momentum` above 0")
    if cfg.nesterov and cfg.optimizer == "lamb":
        raise UsageError("`nesterov` is momentum SGD's (sgd, lars); lamb takes Adam's moments")


def schedule(cfg) -> None:
    """The scaled rate, the warmup, the milestones and the ends of the decay."""
    peak = scaled_lr(cfg.base_lr, cfg.batch_size, cfg.base_batch, cfg.lr_scaling)
    if not 0 < peak <= checks.FLOAT32_MAX:  # the schedule divides by it; the optimizer holds it as a float32
        raise UsageError(f"`base_lr` {cfg.base_lr} scaled for `batch_size` {cfg.batch_size} from `base_batch` "
                         f"{cfg.base_batch} ({cfg.lr_scaling}) gives {peak:g}; the rate must be positive and "
                         "finite")
    if cfg.warmup != "none" and cfg.lr_scaling != "adascale" and not 0 <= cfg.warmup_epochs <= cfg.epochs:
        raise UsageError(f"`warmup_epochs` {cfg.warmup_epochs} is longer than training (`epochs` {cfg.epochs}); "
                         f"use 0..{cfg.epochs} or `warmup` none")
    peak = cfg.lr_schedule().peak
    factor = cfg.lr_factor(peak, 1)
    milestones = factor.milestones
    if any(not 0 < m <= cfg.epochs for m in milestones) or list(milestones) != sorted(milestones):
        raise UsageError(f"`milestones` {','.join(f'{m:g}' for m in milestones)}: must be increasing epochs in "
                         f"(0, {cfg.epochs}]")
    if not 0 <= factor.arccot_epoch <= cfg.epochs:
        raise UsageError(f"`arccot_epoch` {cfg.arccot_epoch}: must be in 0..{cfg.epochs} (`epochs`)")
    if not 0 <= cfg.end_lr < peak:
        raise UsageError(f"`end_lr` {cfg.end_lr}: must be >= 0 and below the scaled rate {peak:g}")


def data(cfg) -> None:
    """The dataset's files, its size against the batch, its memory in every worker."""
    dataset = DATASETS[cfg.dataset]
    wanted = TEXT if dataset.text else IMAGE
    if MODELS[cfg.model].data != wanted:
        fits = ", ".join(name for name, entry in MODELS.items() if entry.data == wanted)
        raise UsageError(f"`model` {cfg.model} does not read the {wanted} of `dataset` {cfg.dataset}; use {fits}")
    if cfg.data_file is not None:
        if not dataset.text:
            raise UsageError(f"`data_file` is a text to train a language model on: it needs `dataset` text, got "
                             f"{cfg.dataset}")
        try:
            check_text_file(cfg.data_file, cfg.model_options["gpt"].block)
        except DataError as err:
            raise UsageError(f"`data_file` {cfg.data_file}: {err}") from None
    refuse("gpt_width", cfg.model_options["gpt"].width, cfg.model_options["gpt"].problem())
    if cfg.dataset != "imagefolder":
        for name in ("skip_bad_images", "loader_workers"):
            if getattr(cfg, name) not in (None, False):
                raise UsageError(f"`{name}` is for images streamed from a folder: it needs `dataset` imagefolder, "
                                 f"got {cfg.dataset}")
    if dataset.check_dir is not None:
        if not cfg.data_dir:
            raise UsageError(f"`dataset` {cfg.dataset} needs `data_dir`: the folder holding {dataset.files}")
        try:
            dataset.check_dir(cfg.data_dir)
        except DataError as err:
            raise UsageError(str(err)) from None
    if cfg.batch_size > cfg.train_size():
        raise UsageError(f"`batch_size` {cfg.batch_size} is larger than the {cfg.dataset} training set "
                         f"({cfg.train_size()} samples)")
    if dataset.memory is not None:  # every worker holds its own copy
        copies = checks.processes_here(cfg.workers)
        problem = checks.fits_in_memory(dataset.memory(cfg.data_request()) * copies)
        refuse("samples", cfg.samples, problem and f"the {cfg.dataset} data of {cfg.side}×"
               f"{cfg.side} images in each of {copies} worker(s): {problem}; use fewer `samples`, a "
               "smaller `image_size` or fewer `workers`")


def advice(cfg) -> list[str]:
    """What a valid configuration is known to lose, and what to add instead (warnings, naming options)."""
    found = []
    if cfg.optimizer == "adamw" and cfg.codec_entry.sparse and not cfg.topk.momentum_correction:
        found.append(f"`codec` {cfg.codec} under `optimizer` adamw sends the gradient in rare spikes that inflate "
                     f"Adam's variance (measured: validation loss {SPARSE_ADAM_LOSS}); `momentum_correction` carries "
                     f"Adam's momentum instead ({SPARSE_ADAM_CORRECTED}; docs/hooks.md)")
    return found
