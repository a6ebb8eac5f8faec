"""The testbed's delay forwarder, validated: per link rate and added one-way latency, `bench link`'s round trip
and rates through it, and the forwarders' own CPU (seconds of a core per GB they carried, and the share of a core
while the link was full). One JSON line a setting, then a table."""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREFIX = "dm"
SETTINGS = [("10mbit", "0", 4), ("10mbit", "25ms", 4), ("100mbit", "0", 32), ("100mbit", "25ms", 32)]


def sh(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


def forwarder_pids() -> list[int]:
    out = sh("ps", "-eo", "pid,args")
    return [int(line.split()[0]) for line in out.splitlines()
            if "scalesgd.testbed.delay" in line and f"{PREFIX}p" in line and "ip netns" not in line]


def cpu_s(pids: list[int]) -> float:
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / 100


def carried_bytes(nodes: int = 2) -> int:
    """Bytes through every node's switch-side port, both ways (what the forwarders carried, where delayed)."""
    total = 0
    for i in range(nodes):
        for way in ("rx", "tx"):
            total += int(sh("ip", "netns", "exec", f"{PREFIX}-sw", "cat",
                            f"/sys/class/net/{PREFIX}p{i}/statistics/{way}_bytes"))
    return total


def measure(rate: str, latency: str, megabytes: int) -> dict:
    sh("scalesgd", "testbed", "up", "--nodes", "2", "--bandwidth", rate, "--latency", latency, "--prefix", PREFIX)
    try:
        pids = forwarder_pids()
        before, carried, began = cpu_s(pids), carried_bytes(), time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            sh("scalesgd", "testbed", "run", "--prefix", PREFIX, "--", "scalesgd", "bench", "link", "--megabytes",
               str(megabytes), "--repeats", "3", "--out", out)
            result = json.loads((Path(out) / "link.json").read_text())["result"]
        wall, used = time.perf_counter() - began, cpu_s(pids) - before
        moved = carried_bytes() - carried
    finally:
        sh("scalesgd", "testbed", "down", "--prefix", PREFIX)
    return {"rate": rate, "latency": latency, "rtt_ms": round(result["rtt_ms"], 2),
            "one_way_mbit_s": round(result["best_one_way_mbit_s"], 2),
            "duplex_mbit_s_each_way": round(result["best_duplex_mbit_s_each_way"], 2),
            "forwarders": len(pids), "forwarder_cpu_s": round(used, 2), "carried_gb": round(moved / 1e9, 4),
            "cpu_s_per_gb": round(used / (moved / 1e9), 2) if pids and moved else 0.0,
            "core_share_while_busy": round(used / wall, 3) if pids else 0.0, "wall_s": round(wall, 1)}


def main() -> None:
    rows = []
    for rate, latency, megabytes in SETTINGS:
        rows.append(measure(rate, latency, megabytes))
        print(json.dumps(rows[-1]), flush=True)
    print("\n| rate | added one-way | round trip | one way | duplex, each way | forwarders' CPU |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        cost = (f"{r['cpu_s_per_gb']:.1f} s a GB ({100 * r['core_share_while_busy']:.1f} % of a core)"
                if r["forwarders"] else "none")
        print(f"| {r['rate']} | {r['latency']} | {r['rtt_ms']:.2f} ms | {r['one_way_mbit_s']:.2f} Mbit/s | "
              f"{r['duplex_mbit_s_each_way']:.2f} Mbit/s | {cost} |")


if __name__ == "__main__":
    sys.exit(main())
