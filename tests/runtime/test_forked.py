"""A worker forked from the server runs its module as `python -m` would: its arguments, environment, working
directory, output and exit status, a signal's death read as Popen reads it."""

import json
import os
import signal
import subprocess
import sys
import time

from pathlib import Path

import pytest

from scalesgd.runtime import launcher
from scalesgd.runtime.forked import Forked, ForkedHere, module_of

MODULE = "tests.runtime.forked_module"
ROOT = str(Path(__file__).parents[2])  # where `tests` is imported from


def test_only_this_interpreters_python_m_is_forked():
    assert module_of([sys.executable, "-m", "scalesgd.train.worker", "run"]) == "scalesgd.train.worker"
    assert module_of(["ip", "netns", "exec", "n0", sys.executable, "-m", "scalesgd"]) is None
    assert module_of(["/other/python", "-m", "scalesgd"]) is None
    assert isinstance(launcher.start(["/bin/true"], dict(os.environ), None), subprocess.Popen)


def test_a_forked_worker_sees_its_arguments_environment_directory_and_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out.json"
    env = {"RANK": "3", "ONLY_HERE": "yes", "PYTHONPATH": ROOT}
    with out.open("w") as stdout:
        worker = Forked(MODULE, ["say", "7"], env, stdout)
        assert worker.wait(60) == 7 and worker.returncode == 7 and worker.poll() == 7
    seen = json.loads(out.read_text())
    assert seen["argv"][1:] == ["say", "7"] and seen["argv"][0].endswith("forked_module.py")
    assert seen["env"] == env  # nothing of the launcher's own environment leaks in
    assert seen["cwd"] == seen["path"][0] == str(tmp_path) and seen["path"][1] == ROOT  # as `python -m` has it
    assert seen["name"] == "scalesgd-r3"


def test_a_signalled_worker_reads_as_minus_the_signal_and_wait_times_out_until_then(tmp_path):
    ready = tmp_path / "ready"
    worker = Forked(MODULE, ["wait", str(ready)], dict(os.environ, PYTHONPATH=ROOT), subprocess.DEVNULL)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            worker.wait(0.01)
        while not ready.exists():
            assert worker.poll() is None
            time.sleep(0.01)
        worker.terminate()
        assert worker.wait(30) == -signal.SIGTERM
    finally:
        worker.kill()


def test_an_exception_in_the_module_is_a_traceback_and_status_one(capfd):
    worker = Forked(MODULE, ["raise"], dict(os.environ, PYTHONPATH=ROOT), subprocess.DEVNULL)
    assert worker.wait(60) == 1
    err = capfd.readouterr().err
    assert err.startswith("Traceback") and err.strip().endswith("RuntimeError: raised in the worker"), err


def test_the_launchers_own_script_is_not_run_again_in_its_workers(tmp_path):
    script = tmp_path / "user_script.py"  # a user's script with no `if __name__ == "__main__":` guard
    script.write_text("import os, subprocess\n"
                      "from scalesgd.runtime.forked import Forked\n"
                      "print('the script ran', flush=True)\n"
                      f"env = dict(os.environ, PYTHONPATH={ROOT!r})\n"
                      f"print(Forked({MODULE!r}, ['say', '0'], env, subprocess.DEVNULL).wait(60))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.stdout.splitlines() == ["the script ran", "0"], done.stderr


def test_a_worker_forked_by_the_launcher_itself_runs_as_one_from_the_server_and_takes_nothing_of_the_launchers(
        tmp_path):
    script = tmp_path / "launcher.py"  # as a joining elastic launch: torch imported, a handler and an exit function
    script.write_text(f"""import atexit, json, os, signal, subprocess, sys, time
import torch
from scalesgd.runtime.forked import ForkedHere
signal.signal(signal.SIGTERM, lambda *_: print("the launcher's handler", flush=True))
atexit.register(print, "the launcher's exit function")
print("buffered in the launcher", end="")
env = {{"RANK": "2", "ONLY_HERE": "yes", "PYTHONPATH": {ROOT!r}}}
with open("said.json", "w") as out:
    said = ForkedHere({MODULE!r}, ["say", "7"], env, out).wait(60)
waiting = ForkedHere({MODULE!r}, ["wait", "ready"], dict(os.environ, PYTHONPATH={ROOT!r}), subprocess.DEVNULL)
while not os.path.exists("ready"):
    assert waiting.poll() is None
    time.sleep(0.01)
try:
    waiting.wait(0.01)
except subprocess.TimeoutExpired:
    waiting.terminate()
print("", json.dumps([said, waiting.wait(30), waiting.poll()]))
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # the launcher's buffered line written once, its exit function run once (by itself), never its handler
    assert done.stdout.splitlines() == ["buffered in the launcher " + json.dumps([7, -signal.SIGTERM,
                                                                                   -signal.SIGTERM]),
                                        "the launcher's exit function"], done.stdout
    seen = json.loads((tmp_path / "said.json").read_text())
    assert seen["argv"][1:] == ["say", "7"] and seen["env"] == {"RANK": "2", "ONLY_HERE": "yes", "PYTHONPATH": ROOT}
    assert seen["cwd"] == str(tmp_path) and seen["path"][:2] == [str(tmp_path), ROOT]
    assert seen["name"] == "scalesgd-r2"
