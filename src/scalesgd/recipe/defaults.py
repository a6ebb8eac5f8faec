"""The recipe a run's choices bring: where the user gives no value, the model they picked sets its own (the GPT its
optimizer, batch and length), then the optimizer its own (AdamW a rate of Adam's order), then the codec its own
(SparseLoCo's outer step, plain averaging), then the option's default, momentum SGD's. The values are resolved when
the configuration is built, so config.json holds them."""

from __future__ import annotations

from collections.abc import Callable

from scalesgd.models import MODELS
from scalesgd.optim import OPTIMIZERS
from scalesgd.options import value_text
from scalesgd.registry import Registry


def brought(given: dict, model: str, optimizer: str, codecs: Registry | None = None) -> dict:
    """The options (by flat name) that the chosen model, then the chosen optimizer, then the chosen codec (of
    `codecs`, a layer above this one: its outer step, so only where `given` synchronises periodically) set where
    `given` is silent; `model` and `optimizer` are those options' own defaults."""
    model = given.get("model", model)
    found = dict(MODELS[model].recipe) if model in MODELS else {}
    optimizer = given.get("optimizer", found.get("optimizer", optimizer))
    if optimizer in OPTIMIZERS:
        found = {**OPTIMIZERS[optimizer].recipe, **found}
    if codecs is not None and given.get("codec") in codecs and given.get("local_steps"):
        found = {**codecs[given["codec"]].recipe, **found}
    return {name: value for name, value in found.items() if name not in given}


def shown(name: str, *more: Registry) -> Callable[[str], str]:
    """What `--help` shows as an option's default: its own, then what each model and optimizer (and each entry of
    `more` registries: the codecs) brings instead."""
    def text(own: str) -> str:
        by_value: dict[str, list[str]] = {}
        for registry in (MODELS, OPTIMIZERS, *more):
            for choice, entry in registry.items():
                if name in entry.recipe:
                    by_value.setdefault(value_text(entry.recipe[name]), []).append(choice)
        return "; ".join([own or "none"] + [f"{', '.join(choices)}: {value}" for value, choices in by_value.items()])
    return text
