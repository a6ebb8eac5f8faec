"""The codec registry: every entry is what it says, and a codec registered by a user trains through
`scalesgd train` on both engines without any other file knowing about it."""

import json
import os
import socket
import tempfile
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from scalesgd.cli import main
from scalesgd.comm.codecs import CODECS, Codec, CodecEntry, Exchange, make_codec
from scalesgd.comm.engine.exchange import ENGINES
from scalesgd.runtime.process_group import exit_process


def test_every_entry_builds_what_it_declares():
    for name, entry in CODECS.items():
        assert entry.engines is None or set(entry.engines) <= set(ENGINES), name
        if entry.build is None:
            assert entry.torch_hook is not None and entry.engines == ("ddp",), name
            with pytest.raises(ValueError, match="PyTorch's own hook"):
                make_codec(name)
            continue
        codec = make_codec(name)
        assert codec.name == name and codec.needs_topology == entry.needs_topology, name
    assert [n for n, e in CODECS.items() if e.plannable] == ["topk"]
    assert {n: e.buckets for n, e in CODECS.items() if e.buckets} == {"topk-global": "single", "lags": "layer"}


class Float64Codec(Codec):
    """A toy: gradients travel as float64, unchanged in value; it counts its exchanges (its state)."""

    name = "float64"

    def __init__(self):
        self.exchanges = 0

    def start(self, flat, bucket, channel, scratch):
        self.exchanges += 1
        return Float64Exchange(flat, channel)

    def state_dict(self) -> dict:
        return {"exchanges": self.exchanges}

    def load_state_dict(self, state: dict) -> None:
        self.exchanges = state["exchanges"]


class Float64Exchange(Exchange):
    """One piece: the bucket as float64, summed with the channel's allreduce, divided back into the bucket."""

    def __init__(self, flat, channel):
        self.flat, self.channel, self.wire = flat, channel, flat.double()
        self.bounds = [(0, flat.numel())]

    def transfer(self, piece):
        return self.channel.allreduce_steps(self.wire, piece.tag)

    def decode(self, piece):
        self.flat.copy_(self.wire / self.channel.world_size)


TINY = ["--dataset", "synthetic", "--samples", "256", "--image-size", "8", "--model", "resnet8", "--batch-size", "64",
        "--epochs", "1", "--warmup", "none", "--quiet"]


def _worker(rank: int, world: int, port: int, argv: list[str], codes: str) -> None:
    """One rank of a torchrun-like launch that knows the toy codec (registered here, in the worker only)."""
    CODECS.add("float64", CodecEntry("a toy: float64 on the wire", lambda settings: Float64Codec()))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    code = main(["train", *argv])
    Path(codes, str(rank)).write_text(str(code))
    exit_process(0)


def train_with_the_toy(run_dir: Path, *engine: str) -> list[int]:
    with socket.socket() as s, tempfile.TemporaryDirectory() as codes:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        argv = [*TINY, *engine, "--codec", "float64", "--run-dir", str(run_dir)]
        mp.start_processes(_worker, args=(2, port, argv, codes), nprocs=2, join=True, start_method="spawn")
        return [int(Path(codes, str(r)).read_text()) for r in range(2)]


def test_a_registered_codec_trains_on_both_engines(tmp_path):
    assert "float64" not in CODECS  # known to the workers alone
    for engine in ("scalesgd", "ddp"):
        run = tmp_path / engine
        assert train_with_the_toy(run, "--engine", engine) == [0, 0]
        state = torch.load(run / "checkpoint.pt", weights_only=True)
        steps = 4  # 256 samples, global batch 64
        assert [s["exchanges"] >= steps for s in state["codec_states"]] == [True, True], engine
        assert state["config"]["codec"] == "float64"
    summary = json.loads((tmp_path / "scalesgd" / "summary.json").read_text())
    params = sum(t.numel() for k, t in state["model"].items() if "running" not in k and "num_batches" not in k)
    bytes_sent = summary["iteration"]["mean_bytes_sent"]
    assert bytes_sent == 2 * (2 - 1) / 2 * params * 8  # the ring moves float64: twice fp32's bytes
