"""`scalesgd train`'s periodic-synchronisation options: how many inner steps each worker takes alone, the outer
optimizer that steps the global parameters, and Streaming DiLoCo's fragments, overlap and mixing factor."""

from __future__ import annotations

from dataclasses import dataclass

from scalesgd import checks
from scalesgd.options import option
from scalesgd.periodic.outer import OUTER_LR, OUTER_MOMENTUM

MAX_LOCAL_STEPS = 1_000_000
PEERS = ("", "torchft")  # whose implementation synchronises: ours, or a peer's run in our loop for comparison


@dataclass
class PeriodicConfig:
    """Whether workers exchange every step or every H steps, and how a round's pseudo-gradient steps the model."""

    local_steps: int = option(0, "periodic synchronisation (DiLoCo): each worker takes this many optimizer steps "
                              "alone, then the pseudo-gradient (global − local parameters) travels through --codec "
                              "and the outer optimizer steps the global parameters; 0: the gradients are exchanged "
                              "every step", check=checks.within(0, MAX_LOCAL_STEPS))
    outer_lr: float = option(OUTER_LR, "with --local-steps: the outer optimizer's rate (DiLoCo's Nesterov SGD; 1 "
                             "with --outer-momentum 0 averages the workers' parameters)",
                             check=checks.within(0, 10, low_open=True))
    outer_momentum: float = option(OUTER_MOMENTUM, "with --local-steps: the outer optimizer's Nesterov momentum",
                                   check=checks.within(0, 1, high_open=True))
    fragments: int = option(1, "with --local-steps: the model in this many fragments of whole layers, one "
                            "synchronised every local-steps/fragments steps (Streaming DiLoCo); must divide "
                            "--local-steps", check=checks.at_least(1))
    overlap_steps: int = option(0, "with --local-steps: inner steps a fragment's exchange runs behind on the "
                                "communication thread before it lands (Streaming DiLoCo's τ); below "
                                "local-steps/fragments", check=checks.at_least(0))
    mix: float = option(0.0, "with --local-steps: the share of the local parameters kept where a fragment lands "
                        "(Streaming DiLoCo's α; 0: the global ones alone)", check=checks.within(0, 1))
    peer: str = option("", "with --local-steps: synchronise with another library's implementation in this loop, "
                       "for comparison: torchft (torchft.local_sgd.DiLoCo over its Manager and gloo, fp32 "
                       "pseudo-gradients; pip install 'scalesgd[peers]'); empty: ours", choices=PEERS)

    @property
    def on(self) -> bool:
        """Whether workers synchronise every `local_steps` steps instead of exchanging gradients every step."""
        return self.local_steps > 0
