"""`scalesgd train`'s model options: which network, and the sizes of those that have them (the GPT's)."""

from __future__ import annotations

from dataclasses import dataclass

from scalesgd.models import MODEL_OPTIONS, MODELS, ModelOptions
from scalesgd.options import expanded, option, value_text


@dataclass
class ModelConfig:
    """The network a run trains."""

    name: str = option("resnet8", "the network trained (gpt: a language model, on text); a model's own recipe fills "
                       "the options not given", choices=MODELS, key="model", shown_default=lambda own: own + "".join(
                           f"; {name} brings " + ", ".join(f"--{key.replace('_', '-')} {value_text(value)}"
                                                           for key, value in entry.recipe.items())
                           for name, entry in MODELS.items() if entry.recipe))
    options: ModelOptions = expanded(MODEL_OPTIONS.items, ModelOptions, lambda held, family: held[family],
                                     group="model options: {}")  # each sized model's, --MODEL-OPTION

    @property
    def sequence_length(self) -> int:
        """Tokens a language model reads at once: the GPT's context."""
        return self.options["gpt"].block
