"""Time and bytes to the target of each run of run.sh, straight through and restarted; or (`--wait-for-step N
RUN_DIR`) wait until RUN_DIR's checkpoint stands at step N or later."""

import json
import statistics
import sys
import time
from pathlib import Path

import torch

TARGET = 2.2876  # docs/results.md#time-to-quality: DDP fp32's final loss on local workers + 1 %


def step_of(run: Path) -> int:
    try:
        state = torch.load(run / "checkpoint.pt", weights_only=True)
    except Exception:  # noqa: BLE001 (not written yet, or being replaced)
        return -1
    return state["epoch"] * 256 + state.get("step", 0)


def to_target(run: Path) -> tuple[float, int] | None:
    """(training seconds, bytes this rank sent) at the first evaluation at or below the target."""
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "eval" and record["test_loss"] <= TARGET:
            return record["train_s"], record["bytes_sent"]
    return None


def main() -> None:
    if sys.argv[1] == "--wait-for-step":
        step, run = int(sys.argv[2]), Path(sys.argv[3])
        while step_of(run) < step:
            time.sleep(0.5)
        print(f"{run.name}: checkpoint at step {step_of(run)}, killing", flush=True)
        return
    out = Path(sys.argv[1])
    rows = {}
    for kind in ("whole", "restarted"):
        found = [(seed, to_target(out / f"{kind}-seed{seed}")) for seed in range(3)]
        for seed, hit in found:
            summary = json.loads((out / f"{kind}-seed{seed}" / "summary.json").read_text())
            print(f"{kind} seed {seed}: to target {hit[0]:.1f} s, {hit[1] / 1e6:.3f} MB sent" if hit else
                  f"{kind} seed {seed}: not reached", f"(train_s {summary['train_s']:.1f}, wall "
                  f"{summary['wall_time_s']:.1f} s, bytes {summary['bytes_sent'] / 1e6:.3f} MB)")
        rows[kind] = [hit for _, hit in found if hit]
    for seed in range(3):  # the byte count across the resume: the same at every evaluation both runs made
        evals = [{r["iter"]: r["bytes_sent"] for r in map(json.loads, (out / f"{kind}-seed{seed}" / "metrics.jsonl")
                  .read_text().splitlines()) if r.get("kind") == "eval"} for kind in ("whole", "restarted")]
        both = sorted(evals[0].keys() & evals[1].keys())
        same = sum(evals[0][i] == evals[1][i] for i in both)
        print(f"seed {seed}: bytes sent equal at {same} of {len(both)} evaluations both runs made "
              f"(steps {both[0]}-{both[-1]})")
    for kind, hits in rows.items():
        if hits:
            times, sent = [t for t, _ in hits], [b / 1e6 for _, b in hits]
            print(f"{kind}: {statistics.median(times):.1f} s ({min(times):.1f}-{max(times):.1f}), "
                  f"{statistics.median(sent):.3f} MB ({min(sent):.3f}-{max(sent):.3f}) to {TARGET}, "
                  f"{len(hits)} of 3 seeds")


if __name__ == "__main__":
    main()
