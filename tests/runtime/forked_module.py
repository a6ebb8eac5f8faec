"""Run by tests/runtime/test_forked.py as `python -m tests.runtime.forked_module ACTION`: says what it sees."""

import json
import os
import signal
import sys
from pathlib import Path

if __name__ == "__main__":
    action = sys.argv[1]
    if action == "say":
        print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "path": sys.path,
                          "name": Path("/proc/self/comm").read_text().strip()}))
        sys.exit(int(sys.argv[2]))
    if action == "wait":
        Path(sys.argv[2]).write_text("ready")
        signal.pause()
    if action == "raise":
        raise RuntimeError("raised in the worker")
