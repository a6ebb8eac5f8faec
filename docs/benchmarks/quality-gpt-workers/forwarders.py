"""The testbed's delay forwarders' cost over a benchmark: `snapshot PREFIX NODES` prints their CPU seconds and the
bytes through the delayed switch ports as one JSON line; `cost BEFORE AFTER` prints what was spent between two."""

import json
import subprocess
import sys
import time
from pathlib import Path


def snapshot(prefix: str, nodes: int) -> dict:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    pids = [int(line.split()[0]) for line in out.splitlines()
            if "scalesgd.testbed.delay" in line and f"{prefix}p" in line and "ip netns" not in line]
    ticks = sum(int(f[11]) + int(f[12]) for f in (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                                                  for pid in pids))
    carried = sum(int(subprocess.run(["ip", "netns", "exec", f"{prefix}-sw", "cat",
                                      f"/sys/class/net/{prefix}p{i}/statistics/{way}_bytes"],
                                     capture_output=True, text=True, check=True).stdout)
                  for i in range(nodes) for way in ("rx", "tx"))
    return {"forwarders": len(pids), "cpu_s": ticks / 100, "carried_bytes": carried, "at": time.time()}


def cost(before: dict, after: dict) -> dict:
    cpu, moved, wall = after["cpu_s"] - before["cpu_s"], after["carried_bytes"] - before["carried_bytes"], \
        after["at"] - before["at"]
    return {"forwarders": after["forwarders"], "cpu_s": round(cpu, 1), "carried_gb": round(moved / 1e9, 3),
            "wall_s": round(wall, 1), "core_share": round(cpu / wall, 4) if wall else 0.0,
            "cpu_s_per_gb": round(cpu / (moved / 1e9), 1) if moved else 0.0}


if __name__ == "__main__":
    if sys.argv[1] == "snapshot":
        print(json.dumps(snapshot(sys.argv[2], int(sys.argv[3]))))
    else:
        print(json.dumps(cost(*(json.loads(Path(p).read_text()) for p in sys.argv[2:4]))))
