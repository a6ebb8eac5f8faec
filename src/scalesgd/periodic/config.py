"""`scalesgd train`'s periodic-synchronisation options: how many inner steps each worker takes alone, the outer
optimizer that steps the global parameters, Streaming DiLoCo's fragments, overlap and mixing factor, and what one
worker (replica) is."""

from __future__ import annotations

from dataclasses import dataclass

from scalesgd import checks
from scalesgd.comm.codecs import CODECS
from scalesgd.options import option
from scalesgd.periodic.outer import OUTER_LR, OUTER_MOMENTUM
from scalesgd.periodic.schedule import MAX_LOCAL_STEPS, Schedule
from scalesgd.recipe.defaults import shown

PEERS = ("", "torchft")  # whose implementation synchronises: ours, or a peer's run in our loop for comparison
REPLICAS = ("process", "node")  # what one DiLoCo worker is: each process alone, or each node's processes together


@dataclass
class PeriodicConfig:
    """Whether workers exchange every step or every H steps, and how a round's pseudo-gradient steps the model."""

    local_steps: int = option(0, "periodic synchronisation (DiLoCo): each worker takes this many optimizer steps "
                              "alone, then the pseudo-gradient (global − local parameters) travels through --codec "
                              "and the outer optimizer steps the global parameters; 0: the gradients are exchanged "
                              "every step", check=checks.within(0, MAX_LOCAL_STEPS))
    outer_lr: float = option(OUTER_LR, "with --local-steps: the outer optimizer's rate (DiLoCo's Nesterov SGD; 1 "
                             "with --outer-momentum 0 averages the workers' parameters)",
                             shown_default=shown("outer_lr", CODECS), check=checks.within(0, 10, low_open=True))
    outer_momentum: float = option(OUTER_MOMENTUM, "with --local-steps: the outer optimizer's Nesterov momentum",
                                   shown_default=shown("outer_momentum", CODECS),
                                   check=checks.within(0, 1, high_open=True))
    fragments: int = option(1, "with --local-steps: the model in this many fragments of whole layers, one "
                            "synchronised every local-steps/fragments steps (Streaming DiLoCo); must divide "
                            "--local-steps and be at most the model's layers with parameters",
                            check=checks.at_least(1))
    overlap_steps: int = option(0, "with --local-steps: inner steps a fragment's exchange runs behind on the "
                                "communication thread before it lands (Streaming DiLoCo's τ); below "
                                "local-steps/fragments", check=checks.at_least(0))
    mix: float = option(0.0, "with --local-steps: the share of the local parameters kept where a fragment lands "
                        "(Streaming DiLoCo's α; 0: the global ones alone)", check=checks.within(0, 1))
    carry: bool = option(False, "with --overlap-steps: where a fragment lands, the inner steps taken while its "
                         "exchange ran are added to the new global parameters, not dropped (nor mixed by --mix)")
    replica: str = option("process", "with --local-steps: what one DiLoCo worker is: each process, or each node, "
                          "whose processes run --engine among themselves every step (ddp or scalesgd in fp32, or the "
                          "sharded engines' shards: with --shard node it is always the node) and synchronise with "
                          "the other nodes every --local-steps through --codec; needs 2 nodes or more "
                          "(--procs-per-node)", choices=REPLICAS)
    elastic: bool = option(False, "with --local-steps: rounds among whoever is alive: a worker that dies or stops "
                           "is dropped and the others finish the round, a worker may join a running run "
                           "(--join) and heals from a peer; this launch hosts the coordinator (torchft's "
                           "lighthouse and a store) on --master-addr and prints its address")
    min_workers: int = option(1, "with --elastic: the fewest workers a round may take (a quorum waits for them)",
                              runtime=True, check=checks.at_least(1))
    elastic_grace: float = option(0.0, "with --elastic: seconds a round waits for a worker late to it before it goes "
                                  "on without it (that worker's steps lost, and it heals from a peer at the next "
                                  "round: a minimum quorum and a grace window, as Decoupled DiLoCo's, without its "
                                  "late merge), every worker taking --local-steps steps; 0: none is left out, each "
                                  "worker is planned the steps its pace fits in the typical worker's --local-steps",
                                  check=checks.at_least(0))
    join: str = option("", "with --local-steps: join the elastic run whose coordinator printed this address "
                       "(http://HOST:PORT,HOST:PORT) with this launch's --workers", runtime=True)
    peer: str = option("", "with --local-steps: synchronise with another library's implementation in this loop, "
                       "for comparison: torchft (torchft.local_sgd.DiLoCo over its Manager and gloo, fp32 "
                       "pseudo-gradients; pip install 'scalesgd[peers]'); '': ours", choices=PEERS)
    peer_bucket_mb: float = option(0.0, "with --peer torchft: its pseudo-gradients summed in buckets of this many MB "
                                   "(torchft's use_bucketization: an allreduce a bucket, where a link's round trip "
                                   "is paid per allreduce); 0: an allreduce a tensor, as torchft's DiLoCo example",
                                   check=checks.at_least(0))

    @property
    def on(self) -> bool:
        """Whether workers synchronise every `local_steps` steps instead of exchanging gradients every step."""
        return self.local_steps > 0

    @property
    def schedule(self) -> Schedule | None:
        """When the workers synchronise (ValueError naming the option that cannot be); None where they exchange every
        step."""
        return Schedule.of(vars(self))
