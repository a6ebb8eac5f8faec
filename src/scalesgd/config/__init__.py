"""`scalesgd train`'s configuration (`train.TrainConfig`: its namespaces, each declared beside what it builds) and
the rules between its options (`rules`)."""

from scalesgd.comm.config import AUTO_CODECS, EXCHANGES, ExchangeConfig
from scalesgd.comm.cost.planner import NO_PLANNER
from scalesgd.config.output import OutputConfig
from scalesgd.config.train import RESUME_MAY_CHANGE, TrainConfig
from scalesgd.data.config import AUGMENTS, DataConfig
from scalesgd.models.config import ModelConfig
from scalesgd.recipe.config import PRECISIONS, LrSchedule, RecipeConfig
from scalesgd.config.runtime import RuntimeConfig

__all__ = ["AUGMENTS", "AUTO_CODECS", "EXCHANGES", "NO_PLANNER", "PRECISIONS", "RESUME_MAY_CHANGE", "DataConfig",
           "ExchangeConfig", "LrSchedule", "ModelConfig", "OutputConfig", "RecipeConfig", "RuntimeConfig",
           "TrainConfig"]
