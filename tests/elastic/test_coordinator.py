"""The coordinator's and the heal's pieces: bad input refused naming it, an address read back as printed, who heals
from whom and when the state crosses, and a coordinator's process that imports only what it serves with."""

import subprocess
import sys

import pytest

from scalesgd.elastic.coordinator import Address
from scalesgd.elastic.heal import behind

pytest.importorskip("torchft")


def test_bad_arguments_are_refused_naming_them():
    from scalesgd.elastic import Coordinator, ElasticMembership

    with pytest.raises(ValueError, match="min_workers 0"):
        Coordinator(min_workers=0)
    with pytest.raises(ValueError, match="heartbeat_timeout_s -1"):
        Coordinator(min_workers=1, heartbeat_timeout_s=-1)
    with pytest.raises(ValueError, match="coordinator address 'nowhere'"):
        Address.parse("nowhere")
    with pytest.raises(ValueError, match="slow_tolerance 0.5"):  # before it reaches for any coordinator
        ElasticMembership.connect("http://127.0.0.1:9,127.0.0.1:9", "w0", slow_tolerance=0.5)


def test_the_coordinators_command_refuses_a_bad_timeout_and_an_unresolvable_host_in_one_line(monkeypatch, capsys):
    from scalesgd.elastic import coordinator

    with pytest.raises(SystemExit) as ended:
        coordinator.main(["--min-workers", "1", "--heartbeat-timeout", "0"])
    assert ended.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit) as ended:
        coordinator.main(["--min-workers", "1", "--join-timeout", "-1"])
    said = capsys.readouterr().err
    assert ended.value.code == 2 and said.count("\n") == 1 and "--join-timeout -1" in said
    monkeypatch.setattr(coordinator.socket, "gethostname", lambda: "nowhere.invalid")
    with pytest.raises(SystemExit) as ended:  # a host whose name does not resolve (a testbed node) says so
        coordinator.main(["--min-workers", "1"])
    said = capsys.readouterr().err
    assert ended.value.code == 2 and said.count("\n") == 1 and "'nowhere.invalid'" in said and "--host" in said


def test_a_member_of_no_coordinator_is_told_so_in_one_line_within_its_timeout():
    import socket
    import time

    from scalesgd.elastic.membership import ElasticMembership
    from scalesgd.elastic.outcomes import CoordinatorLost

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    begun = time.monotonic()
    with pytest.raises(CoordinatorLost, match=f"the coordinator at http://127.0.0.1:{port},127.0.0.1:{port} "
                                              "cannot be reached within 1 s .*: start it first"):
        ElasticMembership.connect(f"http://127.0.0.1:{port},127.0.0.1:{port}", "w0", connect_timeout_s=1)
    assert time.monotonic() - begun < 10


def test_the_address_reads_back_as_the_coordinator_prints_it():
    from scalesgd.elastic import Coordinator

    with Coordinator(min_workers=2) as served:
        assert Address.parse(str(served.address)) == served.address
        assert served.store.get("scalesgd/heartbeat_timeout_s").decode() == "1.5"


def test_those_behind_heal_from_the_most_advanced_in_turn():
    assert behind((5, 3, 5, 0)) == [(1, 0), (3, 2)]
    assert behind((4, 4)) == []
    assert behind((0, 0, 0)) == [(1, 0), (2, 0)]  # the run's start: everyone from the first


def test_a_state_healed_behind_crosses_only_once_the_senders_round_exchange_is_over(monkeypatch):
    """The counters and header go at the boundary; the body waits for `after`, so it does not share the sender's
    link with the round's reduce."""
    import threading
    from types import SimpleNamespace

    from scalesgd.elastic import heal

    sent, body_sent = [], threading.Event()

    def send(tensor, dst, group=None, tag=0):
        sent.append((dst, tag))
        if tag == heal.HEAL_TAG:
            body_sent.set()

    monkeypatch.setattr(heal, "dist", SimpleNamespace(send=send, group=SimpleNamespace(WORLD="this quorum's")))
    after = threading.Event()
    assert heal.heal_behind((3, 0), 0, lambda: {"rounds": 3}, lambda: {"outer": {}}, after) is None
    assert sent == [(1, 0), (1, 0)]  # the sizes and the header, at once
    assert not body_sent.wait(0.2) and len(sent) == 2  # the round's exchange not over: the body held back
    after.set()
    assert body_sent.wait(10) and sent[-1] == (1, heal.HEAL_TAG)


def test_at_the_runs_start_only_a_member_whose_state_differs_from_its_senders_is_sent_it(monkeypatch):
    """Every member built its model from the seed: rank 1's state is rank 0's (nothing crosses), rank 2's is not."""
    import hashlib
    from types import SimpleNamespace

    import torch

    from scalesgd.elastic import heal

    states = [{"global": [torch.full((3,), v)], "steps": 0} for v in (1.0, 1.0, 2.0)]
    hashes = [hashlib.sha256(heal._encode(s).numpy().tobytes()).hexdigest() for s in states]

    def run(rank):
        sent, loaded = [], []

        def recv(tensor, src):
            data = heal._encode(states[src])
            tensor.copy_(torch.tensor([data.numel()]) if tensor.dtype == torch.int64 else data)

        def gather(out, mine):
            assert mine == hashes[rank]  # the hash of what this member would send
            out[:] = hashes

        monkeypatch.setattr(heal, "dist", SimpleNamespace(all_gather_object=gather, recv=recv,
                                                          send=lambda tensor, dst: sent.append(dst)))
        source = heal.heal((0, 0, 0), rank, lambda: states[rank], loaded.append, compare=True)
        return source, sent, loaded

    assert run(0)[:2] == (None, [2, 2])  # the size and the state, to rank 2 alone
    assert run(1) == (None, [], [])
    source, _, loaded = run(2)
    assert source == 0 and torch.equal(loaded[0]["global"][0], states[0]["global"][0])


def test_when_the_coordinator_dies_the_members_stop_at_the_next_round_naming_it(tmp_path):
    import multiprocessing
    import subprocess
    import sys

    import torch
    import torch.distributed as dist

    from scalesgd.bench.elastic import worker

    served = subprocess.Popen([sys.executable, "-m", "scalesgd.elastic", "--min-workers", "1",
                               "--host", "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        address = Address.parse(served.stdout.readline().strip())
        store = dist.TCPStore(address.store_host, address.store_port, is_master=False)
        context = multiprocessing.get_context("forkserver")
        workers = [context.Process(target=worker.run, args=(f"w{i}", str(address), str(tmp_path), 100000, {},
                                                             "fp32", 2)) for i in range(2)]
        for process in workers:
            process.start()
        store.wait(["progress/w0/3"])
        served.kill()
        for process in workers:
            process.join(timeout=60)
        assert [process.exitcode for process in workers] == [3, 3]
        for i in range(2):
            error = torch.load(tmp_path / f"w{i}.pt", weights_only=False)["error"]
            assert error.startswith(f"the coordinator at {address} could not ") and "resume from" in error
    finally:
        served.kill()
        served.wait()


def test_a_new_member_after_the_runs_last_round_is_told_the_run_finished():
    # torchrun restarting a process at the run's end: the others left; alone it would start the run over
    import torch.distributed as dist

    from scalesgd.elastic.coordinator import Coordinator
    from scalesgd.elastic.membership import FINISHED_KEY, ElasticMembership
    from scalesgd.elastic.outcomes import RunFinished

    with Coordinator(1, "127.0.0.1") as coordinator:
        address = coordinator.address
        dist.TCPStore(address.store_host, address.store_port, is_master=False).set(FINISHED_KEY, "1")
        late = ElasticMembership.connect(address, "late")
        try:
            with pytest.raises(RunFinished, match="the run.s last round committed without this worker"):
                late.elastic.regroup(0)
        finally:
            late.elastic.close()


def test_the_coordinators_process_imports_neither_the_engines_nor_fsdp2():
    probe = ("import sys, scalesgd.elastic.__main__; print(sorted(m for m in ('scalesgd.comm.engine.exchange', "
             "'torch.distributed.fsdp', 'torch.distributed.checkpoint') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
