"""Local workers forked from a server that has imported torch once: a worker starts in hundredths of a second
rather than the 6-9 s a fresh interpreter spends importing torch, DDP and FSDP2 (2 cores). A launcher of one worker
that holds no threads of its own (an elastic run's `--join`) forks it itself (`ForkedHere`): the server's own
import would be a second one on that host, 6 s of an elastic start's 16 with four hosts on 2 cores."""

from __future__ import annotations

import atexit
import ctypes
import io
import os
import runpy
import select
import signal
import subprocess
import sys
import traceback
from multiprocessing import forkserver, reduction
from multiprocessing.connection import wait as ready
from pathlib import Path

import torch

# what every worker imports before its first step: the server imports it once, each worker shares its pages
PRELOAD = ["torch", "torch.nn.parallel", "torch._dynamo", "torch.distributed.tensor", "scalesgd.train.worker",
           "scalesgd.cli"]
NAME_PREFIX = "scalesgd-r"  # a forked worker's process name (`ps -o comm`, `top`): scalesgd-r<rank>
PR_SET_NAME = 15


def name_process(rank: int) -> None:
    """Name this process scalesgd-r<rank> (`ps -o comm`, `top`; the failure injector finds a worker by it)."""
    ctypes.CDLL(None).prctl(PR_SET_NAME, f"{NAME_PREFIX}{rank}".encode()[:15])


def _exit_at_once() -> None:
    """The fork server's end, when its launcher has ended: without the interpreter's teardown of torch (1-3 s),
    during which the server would hold the launcher's output open and keep its workers alive."""
    os._exit(0)


if any("multiprocessing.forkserver import main" in arg for arg in sys.orig_argv):  # this process is the server
    atexit.register(_exit_at_once)


def module_of(argv: list[str]) -> str | None:
    """The module of `python -m MODULE …` run by this interpreter, which a forked worker runs instead; None for
    anything else (another program, `ip netns exec …`) or where there is no fork server (not Linux)."""
    if sys.platform.startswith("linux") and len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m":
        return argv[2]
    return None


class Forked:
    """One worker forked from the server, with the part of `subprocess.Popen`'s face the launcher uses (pid, poll,
    returncode, wait, terminate, kill); its status reads as a process's (a signal's as minus its number).

    It is multiprocessing's fork server, asked directly rather than through `multiprocessing.Process`: a Process
    would import the launcher's own `__main__` into every worker (a user's script would run again in each)."""

    def __init__(self, module: str, args: list[str], env: dict, stdout=None):
        forkserver.set_forkserver_preload(PRELOAD)  # read when the server starts: once per launching process
        self.args, self.returncode = [sys.executable, "-m", module, *args], None
        payload = io.BytesIO()
        reduction.dump({}, payload)  # nothing of the launcher's main module, path or directory: `_Main` sets its own
        reduction.dump(_Main(module, args, env, os.getcwd()), payload)
        with _output(stdout) as out:
            self._status, data = forkserver.connect_to_new_process([out, 2])
        with open(data, "wb", closefd=True) as pipe:
            pipe.write(payload.getbuffer())
        self.pid = forkserver.read_signed(self._status)

    def poll(self) -> int | None:
        return self._wait(0)

    def wait(self, timeout: float | None = None) -> int:
        if self._wait(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _wait(self, timeout: float | None) -> int | None:
        if self.returncode is None and ready([self._status], timeout):
            try:
                self.returncode = forkserver.read_signed(self._status)  # the server reaps it and sends the status
            except (OSError, EOFError):
                self.returncode = 255  # the server itself was killed
            os.close(self._status)
        return self.returncode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass


class ForkedHere(Forked):
    """One worker forked from this process rather than the server: for a launcher that has imported what the worker
    runs and holds no threads (a fork copies only the calling thread, and any lock another one held)."""

    def __init__(self, module: str, args: list[str], env: dict, stdout=None):
        self.args, self.returncode = [sys.executable, "-m", module, *args], None
        main = _Main(module, args, env, os.getcwd())
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # else the child would write the launcher's buffered lines again
        with _output(stdout) as out:
            pid = os.fork()
            if pid == 0:
                os._exit(_child(main, out))
        self.pid = pid
        self._exited = os.pidfd_open(pid)  # readable once the child has ended

    def _wait(self, timeout: float | None) -> int | None:
        if self.returncode is None and select.select([self._exited], [], [], timeout)[0]:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            os.close(self._exited)
        return self.returncode


def _child(main: _Main, out: int) -> int:
    """In the child of `ForkedHere`: nothing of the launcher's signal handlers or exit functions, the output given,
    then the module; its exit status."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()
    if out != 1:
        os.dup2(out, 1)
    try:
        return main.run()
    except BaseException:  # noqa: BLE001 - never back into the launcher's code
        return 1


class _output:
    """The descriptor a worker's standard output goes to: the launcher's, /dev/null, or a file's."""

    def __init__(self, stdout):
        self.stdout, self.opened = stdout, None

    def __enter__(self) -> int:
        if self.stdout is None:
            return 1
        if self.stdout == subprocess.DEVNULL:
            self.opened = os.open(os.devnull, os.O_WRONLY)
            return self.opened
        return self.stdout if isinstance(self.stdout, int) else self.stdout.fileno()

    def __exit__(self, *_):
        if self.opened is not None:
            os.close(self.opened)


class _Main:
    """What the server's child runs (its `_bootstrap`, as the server calls a process's): `python -m MODULE ARGS`
    started with `env` in `cwd`, its outputs the descriptors passed with it."""

    def __init__(self, module: str, args: list[str], env: dict, cwd: str):
        self.module, self.args, self.env, self.cwd = module, args, env, cwd

    def _bootstrap(self, parent_sentinel: int) -> int:
        os.close(parent_sentinel)
        atexit.unregister(_exit_at_once)
        _leave_server()
        out, err = forkserver.get_inherited_fds()
        for fd, target in ((out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        return self.run()

    def run(self) -> int:
        """Run the module as `python -m` would; its exit status."""
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=stream.isatty())  # as a fresh interpreter buffers these descriptors
        try:
            self._become()
            runpy.run_module(self.module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as end:
            code = _status(end.code)
        except BaseException:
            traceback.print_exc()  # as the interpreter prints it
            code = 1
        finally:
            atexit._run_exitfuncs()  # the server's child ends with os._exit: run what the module registered
            sys.stdout.flush()
            sys.stderr.flush()
        return code

    def _become(self) -> None:
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.env)
        if self.env.get("RANK", "").isdigit():
            name_process(int(self.env["RANK"]))
        if self.env.get("OMP_NUM_THREADS", "").isdigit():  # OpenMP read the server's at its start, not this one
            torch.set_num_threads(int(self.env["OMP_NUM_THREADS"]))
        # `python -m`'s path: the working directory, then PYTHONPATH, then the interpreter's own
        extra = [self.cwd, *filter(None, self.env.get("PYTHONPATH", "").split(os.pathsep))]
        sys.path[:] = extra + [p for p in sys.path if p and p not in extra]
        sys.argv = [self.module, *self.args]
        sys.modules.pop(self.module, None)  # the server may have imported it; `-m` runs it afresh as __main__


def _leave_server() -> None:
    """Hold nothing of the server's: its liveness pipe, held by a worker, would keep the server (and so every
    worker, by the parent-death signal) alive after the launcher dies."""
    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
    server._forkserver_alive_fd = server._forkserver_address = None


def _status(code) -> int:
    """A SystemExit's code as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def worker_pid(rank: int, launcher: int) -> int | None:
    """The process of worker `rank` that the launcher process `launcher` forked (named scalesgd-r<rank>, a child of
    the launcher or of its fork server), or None: what a fault injector kills."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == f"{NAME_PREFIX}{rank}":
                parent = _parent(int(entry.name))
                if launcher in (parent, _parent(parent)):  # forked by the launcher, or by its fork server
                    return int(entry.name)
        except (OSError, ValueError):
            continue
    return None


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
