"""DiLoCo's rounds among whoever is alive (`scalesgd.elastic.ElasticMembership`). At each round boundary the
lighthouse names the members; those behind (a joiner, a worker back from a stop) heal from one that is up to date;
each member's pseudo-gradient is weighted by the inner steps behind it (a joiner's by none; Douillard et al. 2026,
"Decoupled DiLoCo", weigh by the work); and a round that fails part-way — a member killed inside the reduce, or
one that stops heartbeating — is reduced again among the survivors with the same pseudo-gradients and the codec's
state as the round found it (as PCCL retries, rather than torchft's discarding the round). Every round checks that
its members start it from the same global state (a digest through the store) and logs who took part.

The codec's state is what every member shares (fp8's agreed ranges and the steps they are measured at): a joiner
takes it from the peer it heals from. Where the membership heals behind the rounds (`heal_behind`, the CLI's), a
member behind receives the counters and the codec's state at the boundary and the global state on a thread while
the rounds go on: until it lands, the member takes each round's reduce with no work of its own (planned no inner
steps, voting no digest), keeps the means committed, and replays them on the state when it arrives (its digest
checked against the sender's) — the others wait for none of it. A codec that encodes relative to the weights (fp8)
decodes with them too: there the global parameters come at the boundary (half the state) and the member waits for
the outer state before the next round's reduce, so the others wait for part of it.

A codec's error-feedback residuals (top-k, low rank) are each member's own: a dead member's go with it, a joiner's
start at zero (a copy of its source's would send that one's twice). A codec whose state belongs to a fixed set of
workers (1-bit's errors) is refused where the run is configured."""

from __future__ import annotations

import copy
import hashlib
import threading
import time
from collections import deque

import torch
import torch.distributed as dist

from scalesgd.comm.codecs.registry import entry_of
from scalesgd.comm.engine.driver import open_channel
from scalesgd.elastic.heal import Healing, heal, heal_behind
from scalesgd.elastic.outcomes import DivergedError, StateLost
from scalesgd.periodic.rounds import Fragment

PACE_WINDOW = 12  # a member's pace: the mean of its last this many inner steps (across rounds)
HEALING = -1.0  # the pace a member votes while its state is still crossing to it: planned no inner steps


class NewerCrossing(RuntimeError):
    """A member whose state is still crossing to it was named behind a member older than that state: were it
    healed from that member, the rounds between would be lost."""


class ElasticRounds:
    """The rounds of `diloco` (one fragment, no overlap) in its membership's quorums; `log`: one entry a committed
    round (its number, members, retries, the digest it started from, seconds from its boundary to its commit)."""

    def __init__(self, diloco):
        self.diloco, self.elastic = diloco, diloco.members.elastic
        self.synced_at: int | None = None  # inner steps at the last round this member took part in (None: never)
        self.healed_from: str | None = None  # the member this one last healed from
        self.log: list[dict] = []
        self.shared: dict = {}  # the caller's counters that travel with the global state (a loop's data position)
        self.plan: tuple[int, ...] = ()  # each member's inner steps in the coming round, in rank order (empty: H)
        self.clock = time.monotonic  # what paces are read on (`timed_by`)
        self._stepped: list[float] = []  # when this round began (its commit) and each of its inner steps ended
        self._gaps: deque[float] = deque(maxlen=PACE_WINDOW)  # seconds of its latest inner steps
        self.writer = 0  # the rank that writes the run's records: the first whose vote said it holds the state
        self._healing: Healing | None = None  # the global state still crossing to this member (`heal_behind`)
        self._owed: list[tuple[object, bool]] = []  # the rounds committed meanwhile (their means, `average`)
        self._lost = False  # the state that was crossing never came (its sender gone): to be healed again
        self._exchanged = threading.Event()  # this member's part of the current round over (`round`)

    @property
    def step(self) -> int:
        """What this member tells the lighthouse: the rounds it committed, plus one (0: it holds no global state)."""
        return 0 if self.synced_at is None or self._healing is not None else self.diloco.rounds + 1

    @property
    def holds_state(self) -> bool:
        """Whether this member holds the run's global state (not: it has none yet, or it is still crossing)."""
        return self.synced_at is not None and self._healing is None

    def plan_of(self, members: int) -> tuple[int, ...]:
        """Each member's inner steps in the coming round of `members`: the plan, or H for all (before any, or for
        another membership)."""
        return self.plan if len(self.plan) == members else (self.diloco.schedule.local_steps,) * members

    @property
    def planned(self) -> int:
        """The inner steps this member takes in the coming round: H, fewer where it is slower than the others."""
        quorum = self.elastic.quorum
        return self.plan_of(quorum.size)[quorum.rank] if quorum is not None else self.diloco.schedule.local_steps

    def stepped(self) -> bool:
        """Note an inner step's end; whether this member's round ends here (its planned steps taken)."""
        self._stepped.append(self.clock())
        return self.synced_at is not None and self.diloco.steps - self.synced_at >= self.planned

    def timed_by(self, clock) -> None:
        """Read this member's pace on `clock` (seconds) from the next step on: one that stops while the caller
        evaluates or checkpoints between rounds, as the CLI's training clock does, keeps that time out of it."""
        self.clock, self._stepped = clock, []

    def pace(self) -> float:
        """This member's seconds an inner step: the mean of its latest `PACE_WINDOW` steps across rounds, each
        from the end of the one before or the round's commit (on `clock`); 0 before any was timed. The mean, not
        the median: a worker stopped for part of every period (a share of its CPU) has most steps at full speed and
        a few long ones, and only the mean says how many steps it takes in a given time. The first step after a
        commit counts: a member planned one step a round is still timed."""
        self._gaps.extend(b - a for a, b in zip(self._stepped, self._stepped[1:]))
        return sum(self._gaps) / len(self._gaps) if self._gaps else 0.0

    def sit_out(self, average: bool = False) -> None:
        """Take the round this member was planned no inner steps in (its state still crossing to it); `average`:
        the run's last, cut short (`DiLoCo.finish`'s)."""
        self.round(self.diloco.fragments[0], average)

    def join(self) -> None:
        """Into the first quorum: healed where behind, and into the round the others are at (with no work of its
        own) where the run is under way."""
        self.round(self.diloco.fragments[0], joining=True)

    def round(self, fragment: Fragment, average: bool = False, joining: bool = False) -> None:
        """The next round of `fragment` among the members alive, retried among the survivors until one commits.
        Its number is the rounds committed so far, which every member holding the state agrees on (a member
        behind takes the count with it), not its inner steps: a member left out of a round, or the run's last
        rounds cut short, count steps apart. `average`: this member takes it for the run's last, cut short (the
        mean Δ replaces the outer step, as `DiLoCo.finish` asks); the round's members holding the state decide."""
        self._exchanged = threading.Event()
        try:
            self._round(fragment, average, joining)
        finally:
            self._exchanged.set()  # a state healing a member behind crosses from here, off the round's reduce

    def _round(self, fragment: Fragment, average: bool, joining: bool) -> None:
        d, started = self.diloco, time.monotonic()
        sat_out = self._healing is not None  # planned no steps in this round: its state was crossing
        self.land(wait=self._reads_weights())  # a codec that decodes with the weights: this round's, to take part
        period = d.schedule.local_steps
        weight = d.steps - self.synced_at if self.holds_state else 0
        if (0 < weight < period or sat_out and self.synced_at is not None) and not average:
            d.steps = self.synced_at + period  # its plan was fewer steps (or none): the round's count is the others'
        deltas = fragment.deltas(d.weights)
        if weight != period:
            with torch.no_grad():
                torch._foreach_mul_(deltas, weight / period)
        retries, rebuild, late, held = 0, self._lost, 0, True  # held: the state before this round, not healed in it
        self._lost = False
        while True:
            quorum = self.elastic.regroup(self.step, rebuild)
            if quorum.changed:
                # the group itself, not None (the default group at each call): an exchange abandoned in the old
                # group must not post into the new one when its frozen peer comes back
                d.driver.channel = open_channel(d.codec, dist.group.WORLD)
                if max(quorum.steps) == 0 and d.rounds and not self.holds_state:  # not the run's start: its end
                    raise StateLost(f"every member that held the run's global state left while it crossed to this "
                                    f"one (round {d.rounds}): resume the run from its last checkpoint")
                try:
                    source = self._heal(quorum)
                except RuntimeError as error:  # a peer gone while healing: the round is aborted for everyone in it
                    self.elastic.abort(d.rounds)
                    if isinstance(error, NewerCrossing):  # asked again once it holds that state, to send it on
                        self.land(wait=True)
                    retries, rebuild = retries + 1, True
                    continue
                if source is not None:  # behind: a joiner's empty pseudo-gradient, or one back from a stop
                    self.healed_from, late, held = quorum.members[source], weight, False  # its work counts late
                    joining = False  # into the round the others are at
                    if not weight:
                        deltas = [torch.zeros_like(delta) for delta in deltas]
                if max(quorum.steps) == 0 or joining:  # the run's start: nobody has work to reduce yet
                    self.synced_at, self._stepped = d.steps, [self.clock()]
                    return
            number = d.rounds  # the round the others are at, where this member was behind
            saved = copy.deepcopy(d.driver.codec)  # before the exchange reads or writes it
            digest, pace = (self.digest(), self.pace()) if self._healing is None else ("", HEALING)
            flight = fragment.start(number, d.weights, d.driver, d._thread, False, deltas)
            decision = self.elastic.settle(flight.future, number, weight, digest, pace, late,
                                           last=average if held else None)
            if decision.commit:
                break
            if flight.future.done() and flight.future.exception() is None:  # it crossed the link all the same
                d.bytes_sent += flight.future.result()[1]
            d.driver.replace_codec(saved)
            retries, rebuild = retries + 1, True
        flight = fragment.pop(number)
        d.bytes_sent += flight.bytes_sent
        if decision.weight:
            total = quorum.size * period
            if decision.weight != total:
                with torch.no_grad():
                    torch._foreach_mul_(flight.means, total / decision.weight)
            if self._healing is None:
                fragment.commit(flight, d.weights, decision.last)
            else:  # replayed on the global state once it has crossed
                self._owed.append((flight, decision.last))
        d.rounds += 1
        self.synced_at, self._stepped = d.steps, [self.clock()]
        self.plan = planned_steps(decision.paces, period, self.elastic.slow_tolerance)
        self.writer = next((rank for rank, pace in enumerate(decision.paces) if pace >= 0), 0)
        self.log.append({"round": number, "members": list(quorum.members), "retries": retries,
                         "digest": decision.digest, "seconds": round(time.monotonic() - started, 4),
                         "at": time.time(), "weight": decision.weight, "planned": list(self.plan),
                         **({"late": decision.late} if decision.late else {})})

    def digest(self) -> str:
        """A hash of the global parameters and the outer optimizer's state: equal on every member of a round."""
        d, hasher = self.diloco, hashlib.sha256()
        for tensor in [*d.global_params, *_tensors(d.outer.state_dict()["state"])]:
            hasher.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return hasher.hexdigest()[:16]

    # ---- what a joiner is healed with --------------------------------------------------------------
    def _heal(self, quorum) -> int | None:
        """Heal the members of `quorum` behind (collective): the rank this member healed from, else None."""
        if not self.elastic.heal_behind or max(quorum.steps) == 0:  # the run's start: nobody trains meanwhile
            return heal(quorum.steps, quorum.rank, self._state, self._load, compare=max(quorum.steps) == 0)
        healing = heal_behind(quorum.steps, quorum.rank, self._header, self._body, self._exchanged)
        if healing is None:
            return None
        if self._healing is not None and healing.header["rounds"] < self.diloco.rounds:
            raise NewerCrossing(f"round {self.diloco.rounds}: rank {healing.source} holds round "
                                f"{healing.header['rounds']}'s state, older than the one still crossing to this member")
        self._load_header(healing.header)
        self._healing, self._owed = healing, []
        return healing.source

    def land(self, wait: bool = False) -> None:
        """Take the global state that crossed behind the rounds where it has arrived (`wait`: once it has): the
        state the sender held at the boundary, then the rounds committed since, replayed. Where it never came (its
        sender gone), this member holds nothing and its next round's group is built anew to heal it again."""
        healing = self._healing
        if healing is None or not (wait or healing.body.done()):
            return
        self._healing = None
        try:
            body = healing.body.result(timeout=self.elastic.group_timeout.total_seconds())  # its sender frozen
        except Exception:  # noqa: BLE001 - the sender died or its group was replaced: healed again
            self.synced_at, self._owed, self._lost = None, [], True
            return
        d = self.diloco
        if "global" in body:
            self._take_global(body["global"])
        d.outer.load_state_dict(body["outer"])
        if self.digest() != healing.header["digest"]:
            raise DivergedError(f"the global state healed from rank {healing.source} is not the one it said it sent "
                                f"({self.digest()} against {healing.header['digest']})")
        for flight, average in self._owed:
            d.fragments[0].commit(flight, d.weights, average)
        self._owed = []

    def _global_copy(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.diloco.global_params]

    def _take_global(self, values: list[torch.Tensor]) -> None:
        """The global parameters, and the local ones with them, from a peer's."""
        self.diloco._copy(values, self.diloco.global_params)
        self.diloco._copy(values, self.diloco.params)

    def _reads_weights(self) -> bool:
        """Whether the codec encodes (and decodes) relative to the global parameters (its registration says)."""
        entry = entry_of(self.diloco.driver.codec)
        return entry is not None and entry.reads_weights

    def _header(self) -> dict:
        d = self.diloco
        weights = {"global": self._global_copy()} if self._reads_weights() else {}
        return {"steps": d.steps, "rounds": d.rounds, "codec": d.driver.shared_state_dict(),
                "shared": dict(self.shared), "digest": self.digest(), **weights}

    def _body(self) -> dict:
        weights = {} if self._reads_weights() else {"global": self._global_copy()}
        return {"outer": self.diloco.outer.state_dict(), **weights}

    def _load_header(self, header: dict) -> None:
        d = self.diloco
        self.shared = dict(header["shared"])
        d.steps, d.rounds = header["steps"], header["rounds"]
        d.driver.load_state_dict(header["codec"])
        if "global" in header:
            self._take_global(header["global"])
        self.synced_at = d.steps

    def _state(self) -> dict:
        d = self.diloco
        return {"steps": d.steps, "rounds": d.rounds, "global": self._global_copy(),
                "outer": d.outer.state_dict(), "codec": d.driver.shared_state_dict(), "shared": dict(self.shared)}

    def restore(self, state: dict) -> None:
        """Start from a state `DiLoCo.state_dict()` wrote (a checkpoint) with `shared` beside it, as if healed from
        it: before joining, so the lighthouse hears how far this member is."""
        self._load({**state, "shared": state.get("shared", {})})
        d = self.diloco
        d.bytes_sent = state["bytes_sent"]
        period = d.schedule.local_steps
        d.steps = self.synced_at = -(-d.steps // period) * period  # after a last round cut short: the next whole

    def _load(self, state: dict) -> None:
        d = self.diloco
        self.shared = dict(state["shared"])
        d.steps, d.rounds = state["steps"], state["rounds"]
        self._take_global(state["global"])
        d.outer.load_state_dict(state["outer"])
        # what every member shares (fp8's ranges, low rank's factors); its own residuals start at zero
        d.driver.load_state_dict(state["codec"])
        self.synced_at = d.steps


def planned_steps(paces: tuple[float, ...], local_steps: int, tolerance: float | None) -> tuple[int, ...]:
    """Each member's inner steps in the next round from its pace: H for those within `tolerance` of the typical
    member (the lower median of the measured paces: the fastest of two), else as many as it takes in the typical
    member's H steps' time, at least one (Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling":
    local updates by each worker's speed); unmeasured (0), or no tolerance given: H; none for a member still healing
    (`HEALING`). The median, not the fastest: on shared cores one member runs alone while the others wait (the one
    that evaluates between rounds, or while a restarted one builds), and its pace would cut every other's steps."""
    measured = sorted(p for p in paces if p > 0)
    typical = measured[(len(measured) - 1) // 2] if measured else 0.0
    return tuple(0 if p < 0 else local_steps if tolerance is None or not typical or p <= tolerance * typical
                 else max(1, round(local_steps * typical / p)) for p in paces)


def _tensors(state: dict) -> list[torch.Tensor]:
    """The tensors of an optimizer's per-parameter state, in order."""
    return [value for key in sorted(state) for value in state[key].values() if isinstance(value, torch.Tensor)]
