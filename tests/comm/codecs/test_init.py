"""The codec registry: every entry is what it says, and a codec registered from outside the package, with an
option of its own, trains through `scalesgd train --toy-gain …` on both engines without any other file knowing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalesgd.comm.codecs import CODECS, make_codec
from scalesgd.comm.engine.exchange import ENGINES


def test_every_entry_builds_what_it_declares():
    for name, entry in CODECS.items():
        assert entry.engines is None or set(entry.engines) <= set(ENGINES), name
        if entry.build is None:
            assert entry.torch_hook is not None and entry.engines == ("ddp",), name
            with pytest.raises(ValueError, match="PyTorch's own hook"):
                make_codec(name)
            continue
        codec = make_codec(name)
        assert codec.name == name, name
    assert [n for n, e in CODECS.items() if e.plannable] == ["topk"]
    assert {n: e.buckets for n, e in CODECS.items() if e.buckets} == {"topk-global": "single", "lags": "layer"}


PLUGIN = '''"""A codec from outside scalesgd: the mean, times --toy-gain; it counts its exchanges (its state)."""

from dataclasses import dataclass

from scalesgd import checks
from scalesgd.comm.codecs import CODEC_OPTIONS, CODECS, Codec, CodecEntry, Exchange
from scalesgd.options import option


@dataclass(frozen=True)
class ToyOptions:
    gain: float = option(1.0, "what the toy codec multiplies the mean by", check=checks.positive)


class ToyCodec(Codec):
    name = "toy"

    def __init__(self, gain):
        self.gain, self.exchanges = gain, 0

    def start(self, flat, bucket, channel, scratch):
        self.exchanges += 1
        return ToyExchange(flat, channel, self.gain)

    def counters(self):
        return {"toy_gain": self.gain}

    def state_dict(self):
        return {"exchanges": self.exchanges}

    def load_state_dict(self, state):
        self.exchanges = state["exchanges"]


class ToyExchange(Exchange):
    def __init__(self, flat, channel, gain):
        self.flat, self.channel, self.gain = flat, channel, gain
        self.bounds = [(0, flat.numel())]

    def transfer(self, piece):
        return self.channel.allreduce_steps(self.flat, piece.tag)

    def decode(self, piece):
        self.flat.mul_(self.gain / self.channel.world_size)


CODEC_OPTIONS.add("toy", ToyOptions)
CODECS.add("toy", CodecEntry("a toy from a plugin", lambda s: ToyCodec(s.options["toy"].gain), family="toy"))
'''

TINY = ["--dataset", "synthetic", "--samples", "256", "--image-size", "8", "--model", "resnet8", "--batch-size", "64",
        "--epochs", "1", "--warmup", "none", "--quiet"]


def install_plugin(folder: Path) -> dict:
    """The toy codec as an installed distribution would bring it: its module and an entry point in the group
    `scalesgd.codecs`; the environment that puts it on the path (workers inherit it)."""
    (folder / "toy_codec.py").write_text(PLUGIN)
    info = folder / "toy_codec-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-codec\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[scalesgd.codecs]\ntoy = toy_codec\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def scalesgd(env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalesgd", *argv], capture_output=True, text=True, env=env,
                          timeout=300)


def test_a_plugin_codec_with_an_option_of_its_own_trains_on_both_engines(tmp_path):
    env = install_plugin(tmp_path)
    assert "toy" not in CODECS  # this process never saw it: only the plugin's environment knows it
    shown = scalesgd(env, "train", "--help").stdout
    assert "--toy-gain" in shown and "what the toy codec multiplies the mean by" in shown
    for engine in ("scalesgd", "ddp"):
        run = tmp_path / engine
        proc = scalesgd(env, "train", *TINY, "--engine", engine, "--codec", "toy", "--toy-gain", "0.5",
                        "--run-dir", str(run))
        assert proc.returncode == 0, proc.stderr
        assert json.loads((run / "config.json").read_text())["toy_gain"] == 0.5
        steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        gains = [s["toy_gain"] for s in steps if s["kind"] == "iter"]
        assert gains == [0.5] * 4, engine  # 256 samples, global batch 64: every step went through the toy
        folder = run / torch.load(run / "checkpoint.pt", weights_only=True)["rank_states"]
        codec = [torch.load(folder / f"rank{r}.pt", weights_only=True)["codec"] for r in range(2)]
        assert [s["exchanges"] > 0 for s in codec] == [True, True], engine
    bad = scalesgd(env, "train", *TINY, "--codec", "toy", "--toy-gain", "-1", "--run-dir", str(tmp_path / "bad"))
    assert bad.returncode == 2 and bad.stderr == "scalesgd: error: --toy-gain -1.0: must be a positive number\n"
    assert not (tmp_path / "bad").exists()
