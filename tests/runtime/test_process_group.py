"""Joining the process group: which failures mean a lost peer, and which are this rank's own."""

from concurrent.futures import Future

import pytest
import torch
import torch.distributed as dist

from scalesgd import checks
from scalesgd.errors import EXIT_PEER_LOST, EXIT_USAGE, NoDevice, PeerLost
from scalesgd.runtime import process_group
from scalesgd.runtime.launcher import LAUNCHED_MARK
from scalesgd.runtime.process_group import (
    PEER_FAILURE_PATTERNS,
    is_peer_failure,
    launched_by_torchrun,
    link_down,
    peer_lost,
)

# One message as a collective really words it for each pattern (gloo's from a killed and a stopped peer)
SEEN = {
    "connection reset": "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:42697: Connection reset by peer.",
    "connection closed": "[gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:51234",
    "connection refused": "The client socket has failed to connect to [localhost]:29500 (errno: 111 - Connection "
                          "refused).",
    "broken pipe": "[gloo/transport/tcp/pair.cc:598] Write error: Broken pipe",
    "timed out": "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete",
    "pair closure": "Application timeout caused pair closure",
    "collective operation timeout": "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3)",
    "communicator was aborted": "NCCL communicator was aborted on rank 1.",
}


def test_every_pattern_has_a_real_message():
    assert set(SEEN) == set(PEER_FAILURE_PATTERNS)


@pytest.mark.parametrize("pattern", PEER_FAILURE_PATTERNS)
def test_each_pattern_is_a_lost_peer(pattern):
    assert is_peer_failure(RuntimeError(SEEN[pattern]))


@pytest.mark.parametrize("exc", [PeerLost("rank 2 stopped"), dist.DistNetworkError("store unreachable"),
                                 dist.DistStoreError("wait timeout")], ids=["PeerLost", "network", "store"])
def test_errors_of_the_rendezvous_and_our_own_marker_are_a_lost_peer(exc):
    assert is_peer_failure(exc)


def test_an_error_of_this_rank_is_never_a_lost_peer():
    with pytest.raises(RuntimeError) as shape:
        torch.ones(3) + torch.ones(4)
    assert not is_peer_failure(shape.value)
    assert not is_peer_failure(ValueError("the two-stage fp8 sum needs the node groups"))  # a codec's
    assert not is_peer_failure(RuntimeError("[gloo/gloo/allreduce.cc:128] Received data size doesn't match "
                                            "expected size"))  # ranks disagreeing is a bug here, not a death
    assert not is_peer_failure(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_peer_failure(KeyError("socket"))


def test_a_launch_is_recognised_by_its_environment():
    assert launched_by_torchrun({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert not launched_by_torchrun({"RANK": "0", "WORLD_SIZE": "2"})


@pytest.mark.parametrize("state", ["down", "lowerlayerdown"])
def test_a_link_down_or_without_carrier_is_named(tmp_path, state):
    (tmp_path / "eth0").mkdir()
    (tmp_path / "eth0" / "operstate").write_text(f"{state}\n")
    assert link_down({"GLOO_SOCKET_IFNAME": "eth0"}, tmp_path) == "eth0"


def test_a_link_up_unknown_or_unnamed_is_not(tmp_path):
    (tmp_path / "eth0").mkdir()
    (tmp_path / "eth0" / "operstate").write_text("up\n")
    (tmp_path / "lo").mkdir()
    (tmp_path / "lo" / "operstate").write_text("unknown\n")  # loopback never reports up
    assert link_down({"GLOO_SOCKET_IFNAME": "eth0"}, tmp_path) is None
    assert link_down({"GLOO_SOCKET_IFNAME": "lo"}, tmp_path) is None
    assert link_down({"GLOO_SOCKET_IFNAME": "ib9"}, tmp_path) is None  # no such interface here
    assert link_down({}, tmp_path) is None


def test_a_rank_whose_link_is_down_says_it_is_the_one_cut_off(monkeypatch, capsys):
    monkeypatch.setattr(process_group, "link_down", lambda: "eth0")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv(LAUNCHED_MARK, raising=False)  # torchrun's: no launcher of ours to leave the line to
    assert peer_lost(RuntimeError("Timed out waiting 10000ms for recv operation to complete")) == EXIT_PEER_LOST
    assert capsys.readouterr().err == ("scalesgd: error: worker rank 1 is unreachable: its network link eth0 is "
                                       "down\n")


def _a_wrapper_kept_by_a_cycle(rank, world):
    def train():
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        ddp(torch.ones(3, 4)).sum().backward()
        ddp.loop = ddp  # only the collector frees it
    train()
    process_group.finish()


def test_a_ddp_wrapper_kept_by_a_cycle_is_freed_before_the_group_is_destroyed():
    # freed after, it joins gloo's threads holding the GIL one may wait for: a hang at exit
    from tests.spawn_util import ddp_wrappers_at_destroy, run_workers
    assert run_workers(ddp_wrappers_at_destroy, 2, _a_wrapper_kept_by_a_cycle) == [[0], [0]]


def test_a_worker_past_its_hosts_gpus_is_refused_naming_its_rank(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setattr(checks, "gpus_here", lambda: 2)
    assert process_group.device_of(1) == torch.device("cuda", 1)
    with pytest.raises(NoDevice, match=r"worker rank 5 is local rank 2 and PyTorch sees 2 GPU\(s\) on its host: "
                                       r"start at most 2 workers a host"):
        process_group.device_of(2)
    monkeypatch.setattr(checks, "gpus_here", lambda: 0)
    assert process_group.device_of(7) == torch.device("cpu")


def test_the_worker_without_a_gpu_says_why_itself_and_exits_2(monkeypatch, capsys):
    from scalesgd.config.train import TrainConfig
    from scalesgd.train import worker

    monkeypatch.setenv("RANK", "1")  # not rank 0, which speaks for all on bad input every rank meets
    joined = Future()  # the group's join, run beside the model's build, failed on this rank's device
    joined.set_exception(NoDevice("worker rank 1 is local rank 1 and PyTorch sees 1 GPU(s) on its host"))
    monkeypatch.setattr(process_group, "start_init", lambda *_args, **_kwargs: joined)
    assert worker.run(TrainConfig(), None, False) == EXIT_USAGE  # None: under torchrun
    said = capsys.readouterr().err
    assert said == "scalesgd: error: worker rank 1 is local rank 1 and PyTorch sees 1 GPU(s) on its host\n"
