"""The large-minibatch recipe of Goyal et al.: scaling, warmup and schedules, groups, init."""

from scalesgd.recipe.aggregation import global_batch_loss
from scalesgd.recipe.ghost_bn import use_ghost_batch
from scalesgd.recipe.init import initialize
from scalesgd.recipe.params import build_optimizer, build_sgd, param_groups
from scalesgd.recipe.scaling import SCALING_RULES, scaled_lr
from scalesgd.recipe.schedule import SCHEDULES, WARMUPS, LrFactor, build_scheduler, default_milestones

__all__ = [
    "SCALING_RULES", "SCHEDULES", "WARMUPS", "LrFactor", "build_optimizer", "build_scheduler", "build_sgd",
    "default_milestones", "global_batch_loss", "initialize", "param_groups", "scaled_lr", "use_ghost_batch",
]
