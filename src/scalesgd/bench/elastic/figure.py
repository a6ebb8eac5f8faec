"""The picture of `bench elastic-schedule`: for one seed, each mode's validation loss and its rounds' members against
the wall clock from its launch, every fault marked, the target drawn — where the time under faults goes, side by
side."""

from __future__ import annotations

from pathlib import Path

from scalesgd import output

FAULT_COLOURS = {"kill": "tab:red", "stop": "tab:purple", "link": "tab:orange"}


def shown(results: list[dict], seed: int | None = None) -> list[dict]:
    """The runs drawn: those of `seed`, else every mode's run of the lowest seed that every mode ran (none where no
    seed did)."""
    modes = list(dict.fromkeys(r["mode"] for r in results))
    ran = {(r["mode"], r["seed"]): r for r in results}
    if seed is not None:
        return [ran[m, seed] for m in modes if (m, seed) in ran]
    seeds = sorted({seed for _, seed in ran if all((m, seed) in ran for m in modes)})
    return [ran[m, seeds[0]] for m in modes] if seeds else []


def plot(path: Path, results: list[dict], target: float, seed: int | None = None) -> None:
    """One panel a mode (the runs' own records, nothing recomputed)."""
    runs = shown(results, seed)
    if not runs:
        return
    plt = output.pyplot()
    right = max(r["wall_s"] for r in runs)
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.1 * len(runs)), sharex=True, squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        launched = run["launched"]
        ax.plot([e["at"] - launched for e in run["evals"]], [e["test_loss"] for e in run["evals"]], "o-",
                color="tab:blue", ms=2.5, lw=1.2, label="validation loss")
        ax.axhline(target, color="black", ls="--", lw=0.8, label="target")
        for fault in run["faults"]:
            ax.axvline(fault["at"] - launched, color=FAULT_COLOURS.get(fault["fault"], "grey"), lw=0.8, alpha=0.7)
        reached = run.get("to_target_s")
        ax.set_title(f"{run['mode']}: " + (f"target at {reached:.0f} s (evaluations left out)" if reached
                                           else "target not reached"), fontsize=9, loc="left")
        ax.set_ylabel("val. loss", fontsize=8)
        ax.grid(alpha=0.3)
        if run.get("members"):
            twin = ax.twinx()
            twin.step([at - launched for at, _ in run["members"]], [n for _, n in run["members"]], where="post",
                      color="tab:green", lw=1.0, alpha=0.8)
            twin.set_ylim(0, max(n for _, n in run["members"]) + 1)
            twin.set_ylabel("round's members", fontsize=8, color="tab:green")
    for kind, colour in FAULT_COLOURS.items():
        axes[0, 0].plot([], [], color=colour, lw=0.8, label=f"fault: {kind}")
    axes[0, 0].legend(fontsize=7, loc="upper right", ncol=3)
    axes[-1, 0].set_xlim(0, right)
    axes[-1, 0].set_xlabel(f"wall seconds from the launch, evaluations in (seed {runs[0]['seed']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
