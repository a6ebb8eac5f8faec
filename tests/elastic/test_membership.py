"""A member's heartbeat thread: what it does when the coordinator cannot be reached."""

import threading

from scalesgd.elastic.membership import Elastic


def test_the_heartbeat_thread_retries_a_coordinator_it_cannot_reach_and_never_raises():
    member = Elastic.__new__(Elastic)  # its thread alone: no coordinator, no torchft
    member._stop, member.heartbeat_s = threading.Event(), 0.001
    attempts, beats = [], []

    def own_clients():  # unreachable twice (not up yet, or gone as the run ends), then reachable
        attempts.append(1)
        return ("client", "store") if len(attempts) > 2 else None

    def beat(client, store):
        beats.append((client, store))
        if len(beats) == 3:
            member._stop.set()

    member._own_clients, member._beat = own_clients, beat
    errors = []
    thread = threading.Thread(target=member._heartbeats)
    previous, threading.excepthook = threading.excepthook, lambda args: errors.append(args.exc_value)
    try:
        thread.start()
        thread.join(10)
    finally:
        threading.excepthook = previous
    assert not thread.is_alive() and errors == []
    assert len(attempts) == 3 and beats == [("client", "store")] * 3  # connected once reachable, then kept
