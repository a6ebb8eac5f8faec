"""`scalesgd train`: a new run's configuration, or which run to continue; then workers spawned here, or this process
joining a torchrun launch."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from scalesgd import checks
from scalesgd.comm.engine.exchange import engine_named
from scalesgd.config import TrainConfig, rules
from scalesgd.data.config import absolute_paths
from scalesgd.errors import UsageError, as_flags
from scalesgd.options import Options, nested, option, refuse
from scalesgd.runtime import process_group
from scalesgd.train import checkpoint, elastic_worker, rundir, worker


@dataclass
class TrainCommand(Options):
    """The run's configuration (every `TrainConfig` option) and, to continue a run, its directory."""

    config: TrainConfig = nested(TrainConfig)  # noqa: RUF009 (an option group, as every command's)
    resume: str = option("", "continue the run in this directory from its last checkpoint (options given beside it "
                         "change the stored run's, where a resumed run may)")

    @classmethod
    def from_options(cls, given: dict) -> TrainCommand:
        """The options as typed: under torchrun the launch's world size is the workers; with `resume` the stored
        run's configuration, changed where these options say."""
        given = dict(given)
        resume = given.pop("resume", "")
        if "engine" in given:
            given["engine"] = engine_named(given["engine"])
        if process_group.launched_by_torchrun() and not given.get("join"):  # a joiner's `workers` are the run's
            world = int(os.environ["WORLD_SIZE"])
            if given.get("workers", world) != world:
                raise UsageError(f"`workers` {given['workers']} contradicts the launch's WORLD_SIZE {world}")
            given["workers"] = world
        config = checkpoint.resume_config(resume, absolute_paths(given)) if resume else TrainConfig.from_dict(given)
        return cls(config, resume)

    def validate(self) -> TrainCommand:
        self.config.validate()
        self.config.data.make_paths_absolute()
        return self


def run(command: TrainCommand, argv: list[str]) -> int:
    """Train: join torchrun's launch, or spawn `workers` local processes (continuing a run where asked)."""
    cfg, resume_dir = command.config, command.resume or None
    if int(os.environ.get("RANK", "0")) == 0:
        for line in rules.advice(cfg):
            print(f"scalesgd: warning: {as_flags(line)}", file=sys.stderr)
    if process_group.launched_by_torchrun():
        if cfg.periodic.join:  # each process one member of the elastic run
            return elastic_worker.run_under_torchrun(cfg)
        return worker.run(cfg, *torchrun_run_dir(cfg, resume_dir))
    refuse("workers", cfg.runtime.workers, checks.gpus_problem(cfg.runtime.workers))  # before anything is written
    if resume_dir is not None:
        rundir.write_config(cfg, resume_dir)
        return worker.spawn(cfg, Path(resume_dir), resume=True)
    return spawn_new(cfg)


def spawn_new(cfg: TrainConfig) -> int:
    """A new run on local workers; one that fails at its start leaves nothing that refuses the same command again."""
    made = not (cfg.output.run_dir and Path(cfg.output.run_dir).exists())
    run_dir = rundir.prepare_new_run(cfg)
    code = worker.spawn(cfg, run_dir, resume=False)
    if code:
        rundir.discard_failed_start(run_dir, made)
    return code


def torchrun_run_dir(cfg: TrainConfig, resume_dir: str | None) -> tuple[Path | None, bool]:
    """Under torchrun: (run directory, resume). A restart (torchrun --max-restarts) of a run with a --run-dir
    continues in it, from its last checkpoint where it has one; None: rank 0 makes a new one."""
    if resume_dir is not None:
        return Path(resume_dir), True
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and cfg.output.run_dir:
        return Path(cfg.output.run_dir), (Path(cfg.output.run_dir) / rundir.CHECKPOINT_NAME).exists()
    return None, False
