"""A membership that changes: each round's members are the quorum torchft's lighthouse issues from the members'
heartbeats, in a new torch.distributed default group (gloo) built on the run's store for every quorum; a round
commits where every member of its quorum says its exchange finished, and is decided aborted the moment one says it
failed or stops heartbeating — whichever the store records first (`compare_set`), so every member takes the same
decision.

    membership = ElasticMembership.connect(address, "w0", config="gpt fp8 H16")   # heartbeats start
    quorum = membership.elastic.regroup(step)         # at a round boundary: who is in, a new group if that changed
    decision = membership.elastic.settle(future, round_number, weight)             # commit or abort, and the work
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from scalesgd.comm.wire.membership import Membership
from scalesgd.elastic.coordinator import (
    HEARTBEAT_S,
    TIMEOUT_KEY,
    Address,
    lighthouse_module,
)
from scalesgd.elastic.outcomes import (
    CoordinatorLost,
    Decision,
    DivergedError,
    Quorum,
    RefusedError,
    RunFinished,
)

log = logging.getLogger(__name__)
FINISHED_KEY = "run/finished"  # in the store: the run's last round committed
DONE_PREFIX = "done/"  # + a worker's name: it took the last round
FINAL_PREFIX = "final/"  # + a member's id: the digest of the global state it ended the run with
SLOW_TOLERANCE = 1.25  # a member this much slower than the typical one still takes every inner step of a round
LATE = "the run's last round committed without this worker; nothing left for it to do"
POLL_S = 0.02  # how often a member that finished its exchange looks for the round's decision


class Elastic:
    """This member's side of the coordinator: a heartbeat every `heartbeat_s` (to the lighthouse, and a counter in
    the store its peers watch), the quorum it is in and the group built for it, and each round's decision. A peer
    whose counter has not moved for the coordinator's heartbeat timeout is dead to this member as to the
    lighthouse. A member more than `slow_tolerance` times slower a step than the typical one is planned fewer steps a
    round, so it arrives with the others (None: every member takes every step, the slowest setting the pace).
    `heal_behind`: a member behind receives the global state while the rounds go on (a loop that deals it no inner
    steps until it lands, as the CLI's does), rather than every member waiting at the boundary while it crosses."""

    def __init__(self, address: Address | str, name: str, config: str = "", heartbeat_s: float = HEARTBEAT_S,
                 start_workers: int = 1, quorum_timeout_s: float = 600.0, group_timeout_s: float = 60.0,
                 connect_timeout_s: float = 30.0, slow_tolerance: float | None = SLOW_TOLERANCE,
                 heal_behind: bool = False):
        if slow_tolerance is not None and (isinstance(slow_tolerance, bool) or
                                           not isinstance(slow_tolerance, (int, float)) or slow_tolerance < 1):
            raise ValueError(f"slow_tolerance {slow_tolerance!r}: give a ratio of at least 1 (a member that much "
                             "slower than the typical member still takes every step), or None (every member every step)")
        self.slow_tolerance, self.heal_behind = slow_tolerance, bool(heal_behind)
        self.address = Address.parse(address) if isinstance(address, str) else address
        self.id = f"{name}-{uuid.uuid4().hex[:8]}"
        self.config, self.heartbeat_s = config, heartbeat_s
        self.quorum_timeout, self.group_timeout = timedelta(seconds=quorum_timeout_s), timedelta(seconds=group_timeout_s)
        self.connect_timeout = timedelta(seconds=connect_timeout_s)
        torchft = lighthouse_module()
        try:
            self._client = torchft.LighthouseClient(self.address.lighthouse, self.connect_timeout)
            self.store = self._store()
            self._beat(self._client, self.store)  # alive before it asks to be in
        except Exception as error:  # noqa: BLE001 - torchft's client and the store raise their own kinds
            raise CoordinatorLost(f"the coordinator at {self.address} cannot be reached within {connect_timeout_s:g} s "
                                  f"({first_line(error)}): start it first (python -m "
                                  "scalesgd.elastic) and give its address as it printed it") from error
        self.grace_s = float(self.store.get(TIMEOUT_KEY).decode()) if self.store.check([TIMEOUT_KEY]) else 3 * heartbeat_s
        self.quorum: Quorum | None = None
        self._attempt = 0  # the group of this quorum being built or in use: the store's count, shared by all
        self._seen: dict[str, tuple[int, float]] = {}  # a peer's heartbeat count, and when it last moved
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeats, name="scalesgd-heartbeat", daemon=True)
        self._thread.start()
        self._await_start(start_workers)

    def _await_start(self, workers: int) -> None:
        """Until `workers` members have started (the run's first quorum then holds them all, rather than whoever
        asked first; one that starts later joins a run under way and passes at once)."""
        self.store.add("started", 1)
        deadline = time.monotonic() + self.quorum_timeout.total_seconds()
        while self.store.add("started", 0) < workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{workers} workers did not start within {self.quorum_timeout}")
            self._stop.wait(POLL_S)

    # ---- heartbeats ------------------------------------------------------------------------------------
    def _store(self) -> dist.TCPStore:
        return dist.TCPStore(self.address.store_host, self.address.store_port, is_master=False,
                             timeout=self.connect_timeout, use_libuv=True)

    def _beat(self, client, store) -> None:
        client.heartbeat(self.id)
        store.add(f"beat/{self.id}", 1)

    def _heartbeats(self) -> None:
        """Beat until closed, on clients of its own (a frozen process stops beating; a busy one does not)."""
        clients = self._own_clients()
        while not self._stop.wait(self.heartbeat_s):
            clients = clients or self._own_clients()
            with suppress(Exception):  # the coordinator unreachable for a beat: the next one tries again
                if clients:
                    self._beat(*clients)

    def _own_clients(self):
        """This thread's lighthouse client and store; None while the coordinator cannot be reached (retried)."""
        with suppress(Exception):  # not up yet, or gone as the run ends: not raised in the thread
            return lighthouse_module().LighthouseClient(self.address.lighthouse, self.connect_timeout), self._store()
        return None

    def dead(self) -> list[str]:
        """The members of this quorum whose heartbeats stopped for the grace window."""
        now, quiet = time.monotonic(), []
        for member in self.quorum.members if self.quorum else ():
            count = self.store.add(f"beat/{member}", 0)
            seen = self._seen.get(member)
            if seen is None or seen[0] != count:
                self._seen[member] = (count, now)
            elif now - seen[1] > self.grace_s:
                quiet.append(member)
        return quiet

    # ---- who is in ------------------------------------------------------------------------------------
    def regroup(self, step: int, rebuild: bool = False) -> Quorum:
        """The quorum for the next round (blocking until the lighthouse issues one), asking with the rounds this
        member has committed (`step`); the default group built anew where its members changed or `rebuild` (after
        a round that aborted), asked again where a member dies or stops before the group is built. RefusedError
        where the most advanced members' configuration is not this one's."""
        while True:
            if self._run_finished():  # late (a new member, or one left out of the last rounds): the others ended it
                raise RunFinished(LATE)
            quorum = self._issue(step, rebuild)
            if self._run_finished():
                raise RunFinished(LATE)
            if not quorum.changed:
                return quorum
            self._seen = {}
            if dist.is_initialized():
                dist.destroy_process_group()  # returns at once, even with a collective of it stuck on a frozen peer
            if self._gathered():
                try:
                    dist.init_process_group("gloo", rank=quorum.rank, world_size=quorum.size,
                                            store=dist.PrefixStore(f"group/{self.round_key('')}", self.store),
                                            timeout=self.group_timeout)
                    return quorum
                except RuntimeError as error:  # one died in the moment between: its rendezvous timed out
                    log.warning("quorum %s group %d of %d members not built (%s): asking again", quorum.key,
                                self._attempt, quorum.size, first_line(error))
                    self._next_attempt()
            rebuild = False  # the next attempt is the store's count: moved on already

    def _run_finished(self) -> bool:
        with self._coordinator("hear whether the run finished"):
            return self.store.check([FINISHED_KEY])

    def _issue(self, step: int, rebuild: bool) -> Quorum:
        """The lighthouse's next quorum, of the members of the most advanced configuration."""
        with self._coordinator("issue the next round's members"):
            issued = self._client.quorum(replica_id=self.id, timeout=self.quorum_timeout, step=step,
                                         data={"config": self.config})
        everyone = sorted(issued.participants, key=lambda member: member.replica_id)
        configs = [m.data["config"] for m in everyone]
        top = max(m.step for m in everyone)
        running = next(c for m, c in zip(everyone, configs) if m.step == top)
        members = [m for m, c in zip(everyone, configs) if c == running]
        if self.config != running:
            raise RefusedError(f"the running members' configuration is {running!r}, this worker's {self.config!r}: "
                               "start it with theirs")
        key = str(issued.quorum_id)
        same = self.quorum is not None and key == self.quorum.key
        if same and rebuild:  # after a round it aborted: past the group that round ran in
            self._next_attempt()
        with self._coordinator("read the round's group"):
            counter = f"attempt/{key}"
            self.store.compare_set(counter, "", "0")  # the quorum's first group, where none was counted yet
            attempt = int(self.store.get(counter).decode())
        changed = not same or attempt != self._attempt
        ids = tuple(m.replica_id for m in members)
        self.quorum, self._attempt = Quorum(key, ids, tuple(m.step for m in members), ids.index(self.id), changed), attempt
        return self.quorum

    def _next_attempt(self) -> None:
        """Count this quorum's group `_attempt` as failed, once for all the members that saw it fail: the count is
        the store's, so a member that saw fewer failures (stuck in a rendezvous, frozen) takes it up when it asks
        again rather than building a group of its own."""
        with self._coordinator("count the round's group as failed"):
            counter = f"attempt/{self.quorum.key}"
            self.store.compare_set(counter, str(self._attempt), str(self._attempt + 1))

    def _gathered(self) -> bool:
        """Whether every member of the new quorum came to build its group: False where one stopped heartbeating
        first (killed or frozen after the lighthouse named it), or not all came within the group's timeout."""
        key, counter = f"arrived/{self.round_key('')}", f"attempt/{self.quorum.key}"
        with self._coordinator("gather the round's members"):
            self.store.add(key, 1)
            deadline = checked = time.monotonic()
            deadline += self.group_timeout.total_seconds()
            while self.store.add(key, 0) < self.quorum.size:
                now = time.monotonic()
                if now - checked > self.heartbeat_s:
                    checked = now
                    if int(self.store.get(counter).decode()) != self._attempt:
                        return False  # the others counted this group failed already
                    quiet = self.dead()
                    if now > deadline or quiet:
                        log.warning("quorum %s group %d: %s gone before its group was built: asking again",
                                    self.quorum.key, self._attempt, quiet or "a member")
                        self._next_attempt()
                        return False
                self._stop.wait(POLL_S)
        return True

    def round_key(self, number) -> str:
        return f"{self.quorum.key}.{self._attempt}/{number}"

    # ---- a round's decision ---------------------------------------------------------------------------
    @contextmanager
    def _coordinator(self, what: str) -> Iterator[None]:
        """CoordinatorLost, naming it and what it could not do, for any failure to reach it."""
        try:
            yield
        except (RefusedError, DivergedError):
            raise
        except Exception as error:  # noqa: BLE001 - torchft's RPCs and the store raise their own kinds
            raise CoordinatorLost(f"the coordinator at {self.address} could not {what} "
                                  f"({first_line(error)}): the run stops here; resume from "
                                  "the last checkpoint") from error

    def settle(self, exchange: Future, number: int, weight: int, digest: str = "", pace: float = 0.0,
               late: int = 0, last: bool | None = False) -> Decision:
        """Wait for this member's exchange of round `number` and take the round's decision: commit once every
        member finished its own (`weight`: the work behind this member's part, summed over the members), abort
        the moment one failed or stopped heartbeating (this member's exchange then abandoned where it is stuck).
        `digest`: the global state this member started the round from; DivergedError where the members' differ.
        `pace`: this member's seconds an inner step, which every member reads in the decision; `late`: of `weight`,
        steps it finished before a stop dropped it from an earlier round. `last`: whether this member takes the
        round for the run's last, cut short (None: it cannot say, having been healed into it: a left-out member's
        count of the data dealt is the others' only from here); the members that can say decide, and must agree."""
        with self._coordinator(f"decide round {number}"):
            return self._settle(exchange, number, weight, f"{digest} {pace:.6f} {late} {_said(last)}")

    def _settle(self, exchange: Future, number: int, weight: int, vote: str) -> Decision:
        key = f"vote/{self.round_key(number)}"
        self.store.set(f"{key}/digest/{self.quorum.rank}", vote)  # one write, read with all
        decision = f"{key}/decision"
        while True:
            try:
                exchange.result(timeout=self.heartbeat_s)
                break
            except FutureTimeout:
                if self.store.check([decision]):  # decided without this member's vote: aborted by a peer
                    return self._decision(key)
                if self.dead():
                    self.store.compare_set(decision, "", "abort")
                    return self._decision(key)
            except Exception:  # noqa: BLE001 - a peer gone mid-exchange: the round is retried without it
                self.store.compare_set(decision, "", "abort")
                return self._decision(key)
        self.store.add(f"{key}/weight", weight)
        if self.store.add(f"{key}/done", 1) == self.quorum.size:
            self.store.compare_set(decision, "", "commit")
        voted = checked = time.monotonic()
        while not self.store.check([decision]):  # the others' votes (polled: the store's wait logs its timeouts)
            self._stop.wait(POLL_S)
            if time.monotonic() - checked > self.heartbeat_s:
                checked = time.monotonic()
                if self.dead() or checked - voted > self.group_timeout.total_seconds():
                    self.store.compare_set(decision, "", "abort")
        return self._decision(key)

    def abort(self, number: int) -> None:
        """Decide round `number` aborted in this quorum (this member cannot take its part)."""
        with self._coordinator(f"abort round {number}"):
            self.store.compare_set(f"vote/{self.round_key(number)}/decision", "", "abort")

    def _decision(self, key: str) -> Decision:
        taken = self.store.get(f"{key}/decision").decode()
        if taken != "commit":
            return Decision(False)
        said = [self.store.get(f"{key}/digest/{rank}").decode().split(" ") for rank in range(self.quorum.size)]
        digests = {digest for digest, *_ in said if digest}  # none from a member whose state is still crossing
        if len(digests) > 1:
            raise DivergedError(f"round {key}: the members started it from different global states "
                                f"{sorted(digests)}")
        last = {flag for *_, flag in said if flag != "-"}
        if len(last) > 1:
            raise DivergedError(f"round {key}: the members holding the state disagree whether it is the run's last")
        return Decision(True, self.store.add(f"{key}/weight", 0), digest=digests.pop() if digests else "",
                        paces=tuple(float(pace) for _, pace, *_ in said), late=sum(int(late) for *_, late, _ in said),
                        last=last == {"1"})

    def finished(self, name: str, digest: str = "") -> None:
        """Say in the store that the run's last round committed, and that `name` took it (it ends by itself; a
        launcher ends a worker of its own that did not: one still waiting to join), ending with the global state
        `digest`."""
        with self._coordinator("hear that the run finished"):
            self.store.set(f"{DONE_PREFIX}{name}", "1")
            if digest:
                self.store.set(f"{FINAL_PREFIX}{self.id}", digest)
            self.store.set(FINISHED_KEY, "1")

    def final_digests(self, wait_s: float | None = None) -> dict[str, str]:
        """The global state's digest each member of the last round ended the run with, of those that said so
        within `wait_s` (the group's timeout by default; one that died after the last round says nothing)."""
        keys = {member: FINAL_PREFIX + member for member in self.quorum.members}
        deadline = time.monotonic() + (self.group_timeout.total_seconds() if wait_s is None else wait_s)
        with self._coordinator("hear how the members ended"):
            while True:
                said = {m: self.store.get(k).decode() for m, k in keys.items() if self.store.check([k])}
                if len(said) == len(keys) or time.monotonic() > deadline:
                    return said
                self._stop.wait(POLL_S)

    def close(self) -> None:
        self._stop.set()
        if dist.is_initialized():
            dist.destroy_process_group()


@dataclass(frozen=True)
class ElasticMembership(Membership):
    """The run's collectives in the current quorum's group (the default group, rebuilt per quorum); rounds may
    abort."""

    elastic: Elastic | None = field(default=None, compare=False)

    @classmethod
    def connect(cls, address: Address | str, name: str, config: str = "", **options) -> ElasticMembership:
        """Heartbeats start; the group is built at the first `regroup`."""
        return cls(elastic=Elastic(address, name, config, **options))

    @property
    def may_abort(self) -> bool:
        return True


def _said(flag: bool | None) -> str:
    """A yes, no or no-say in a vote."""
    return "-" if flag is None else str(int(flag))


def first_line(error: Exception) -> str:
    """What a failure says, in one line short enough for ours."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
