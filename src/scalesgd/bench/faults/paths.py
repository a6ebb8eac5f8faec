"""The new paths' scenarios: a data loader killed, the image folder gone, a full disk, a node's link down."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scalesgd.bench.faults.runs import (
    IMAGE_EPOCHS,
    POLL_S,
    SKIPPED,
    TRAIN,
    TRAIN_EPOCHS,
    Outcome,
    Settings,
    _end,
    _epoch,
    _fake_tree,
    _on_images,
    _said,
    _scalesgd,
    _started,
    _stopped_and_resumed,
    _train,
    _until,
    loader_of,
    rank_of,
)
from scalesgd.testbed import netns
from scalesgd.testbed.spec import TestbedSpec

TMPFS_SIZE = "16m"  # the disk-full scenario's run directory: room for its files and three checkpoints
FLAP_S = 5.0  # the link-flap scenario: how long the link is down (under the default --timeout)


def kill_loader(cfg: Settings, run_dir: Path) -> Outcome:
    _, run, proc, workers = _on_images(cfg, run_dir)
    loader = loader_of(next(p for p in workers if rank_of(p) == 1))
    os.kill(loader, signal.SIGKILL)
    start = time.monotonic()
    code, lines = _end(proc)
    took = time.monotonic() - start
    return _stopped_and_resumed("kill-loader", "SIGKILL to rank 1's data loader process, mid-epoch", took, code,
                                lines, run,
                                (f"worker rank 1's data loader process (pid {loader}) was killed by SIGKILL",
                                 "the last good checkpoint is kept"), IMAGE_EPOCHS)


def data_renamed(cfg: Settings, run_dir: Path) -> Outcome:
    tree, run, proc, _ = _on_images(cfg, run_dir)
    away = tree.with_name(tree.name + ".away")
    tree.rename(away)
    start = time.monotonic()
    code, lines = _end(proc)
    took = time.monotonic() - start
    away.rename(tree)  # put back: the run resumes
    return _stopped_and_resumed("data-renamed", "the image folder renamed away mid-run (put back before the resume)",
                                took, code, lines, run, (f"{tree} is gone",), IMAGE_EPOCHS, status=2)


def data_deleted(cfg: Settings, run_dir: Path) -> Outcome:
    tree, run, proc, _ = _on_images(cfg, run_dir)
    start = time.monotonic()
    shutil.rmtree(tree)
    code, lines = _end(proc)
    took = time.monotonic() - start
    _fake_tree(tree)  # written again, the same: the run resumes
    return _stopped_and_resumed("data-deleted", "the image folder deleted mid-run (written again before the resume)",
                                took, code, lines, run,
                                (str(tree), "is gone (removed or renamed while the run read it)"), IMAGE_EPOCHS,
                                status=2)


def _cannot_run(name: str, fault: str, testbed: bool = False) -> Outcome | None:
    """The outcome of a scenario that cannot run here (it mounts a tmpfs or builds a testbed), saying why; else None."""
    why = "needs root" if os.geteuid() != 0 else None
    if why is None and testbed:
        try:
            netns.check_host()
        except netns.TestbedError as err:
            why = str(err)
    return None if why is None else Outcome(name, fault, 0.0, f"{SKIPPED}{why}", True)


@contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A small tmpfs mounted at `folder`, unmounted at the end whatever happened."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def free_bytes(folder: Path) -> int:
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize


def fill_while(proc: subprocess.Popen, filler: Path, leave: int) -> float:
    """Keep `filler` growing so that at most `leave` bytes stay free until the run ends (a checkpoint needs more);
    when the disk was first full."""
    full_at = None
    with filler.open("ab") as f:
        while proc.poll() is None:
            room = free_bytes(filler.parent) - leave
            if room > 0:
                try:
                    f.write(bytes(room))
                    f.flush()
                except OSError:  # the run took some meanwhile: full all the same
                    pass
            elif full_at is None:
                full_at = time.monotonic()
            time.sleep(POLL_S)
    return full_at if full_at is not None else time.monotonic()


def disk_full(cfg: Settings, run_dir: Path) -> Outcome:
    fault = f"the run directory's {TMPFS_SIZE} tmpfs filled while a checkpoint is written (space freed for the resume)"
    skipped = _cannot_run("disk-full", fault)
    if skipped is not None:
        return skipped
    with tmpfs(run_dir / "tmpfs", TMPFS_SIZE) as disk:
        run, filler = disk / "run", disk / "filler"
        proc = _train(run, cfg)
        _started(proc, run, cfg.workers)
        full_at = fill_while(proc, filler, (run / "checkpoint.pt").stat().st_size // 2)
        code, lines = _end(proc)
        took = time.monotonic() - full_at
        filler.unlink()
        result = _stopped_and_resumed("disk-full", fault, took, code, lines, run,
                                      (f"no space left writing checkpoint {run / 'checkpoint.pt'}",
                                       "(previous checkpoint kept)"), TRAIN_EPOCHS)
        shutil.copytree(run, run_dir / "run")  # kept (if the scenario failed) to look into, after the unmount
    return result


def _broken(result: Outcome) -> Outcome:
    return Outcome(result.scenario, result.fault, result.seconds, result.outcome, False)


@contextmanager
def testbed(cfg: Settings) -> Iterator[TestbedSpec]:
    """A testbed of one node per worker (1 Gbit/s links) for this bench alone, taken down at the end."""
    spec = netns.up(TestbedSpec(nodes=cfg.workers, procs_per_node=1, bandwidth="1gbit",
                                prefix=f"fault{os.getpid() % 1000}").validate())
    try:
        yield spec
    finally:
        netns.down(spec.prefix)


def _on_testbed(spec: TestbedSpec, cfg: Settings) -> tuple[str, ...]:
    """The launch that runs a command on the testbed's nodes (then `scalesgd …`)."""
    return "testbed", "run", "--prefix", spec.prefix, "--timeout", str(cfg.timeout), "--"


def _train_on_testbed(spec: TestbedSpec, cfg: Settings, run: Path) -> subprocess.Popen:
    proc = _scalesgd(*_on_testbed(spec, cfg), "scalesgd", "train", "--run-dir", str(run), "--timeout",
                     str(cfg.timeout), *TRAIN)
    _started(proc, run, cfg.workers)
    return proc


@contextmanager
def _link_cut(cfg: Settings, run: Path) -> Iterator[tuple[TestbedSpec, subprocess.Popen]]:
    """A run on the testbed, rank 1's link taken down once every worker has started."""
    with testbed(cfg) as spec:
        proc = _train_on_testbed(spec, cfg, run)
        netns.set_link(spec, 1, up=False)
        yield spec, proc


def link_flap(cfg: Settings, run_dir: Path) -> Outcome:
    fault = f"rank 1's link down for {FLAP_S:g} s mid-step (testbed, --timeout {cfg.timeout:g})"
    skipped = _cannot_run("link-flap", fault, testbed=True)
    if skipped is not None:
        return skipped
    with _link_cut(cfg, run_dir / "run") as (spec, proc):
        try:
            proc.wait(FLAP_S)
        except subprocess.TimeoutExpired:
            pass
        netns.set_link(spec, 1, up=True)
        back = time.monotonic()
        went_on = _went_on(proc, run_dir / "run", time.time())
        code, lines = _end(proc)
        took = time.monotonic() - back
    epoch = _epoch(run_dir / "run")
    return Outcome("link-flap", fault, took, f"exit {code}: {_said(lines)}; trained on within {went_on:.1f} s of the "
                   f"link coming back (its next checkpoint) to epoch {epoch} of {TRAIN_EPOCHS}, ending {took:.1f} s "
                   "after it", code == 0 and not lines and epoch == TRAIN_EPOCHS)


def _went_on(proc: subprocess.Popen, run_dir: Path, since: float) -> float:
    """Seconds until the run's next checkpoint after `since` (wall clock), or its end: a checkpoint gathers from
    every rank, so steps went through the link again by then."""
    start = time.monotonic()
    _until(lambda: proc.poll() is not None or (run_dir / "checkpoint.pt").stat().st_mtime > since, 120)
    return time.monotonic() - start


def link_down(cfg: Settings, run_dir: Path) -> Outcome:
    fault = f"rank 1's link down until the run ends (testbed, --timeout {cfg.timeout:g})"
    skipped = _cannot_run("link-down", fault, testbed=True)
    if skipped is not None:
        return skipped
    run = run_dir / "run"
    with _link_cut(cfg, run) as (spec, proc):
        start = time.monotonic()
        code, lines = _end(proc, cfg.timeout + 60)
        took = time.monotonic() - start
        netns.set_link(spec, 1, up=True)
        result = _stopped_and_resumed("link-down", fault, took, code, lines, run,
                                      ("worker rank 1 is unreachable: its network link eth0 is down",), TRAIN_EPOCHS,
                                      *_on_testbed(spec, cfg))
    return result if took < cfg.timeout + 10 else _broken(result)
