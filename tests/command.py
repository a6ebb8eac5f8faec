"""Running a `scalesgd` command line for the tests: in this process, with its status and all its output."""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile

import torch

from scalesgd.cli import main
from scalesgd.runtime.launcher import Stopped


def scalesgd(*argv, cwd=None, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """`scalesgd ARGV` as the command line runs it: its exit status, and its stdout and stderr with its workers'
    (they are processes of their own, as always). The command itself runs in this process, which has torch imported
    already (a new interpreter spends 4-5 s on that); past `timeout` it is stopped as a signal stops it, its
    workers with it. Whatever it changes in this process (directory, environment, threads, torch's random state) is
    put back."""
    argv = [str(a) for a in argv]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        with _kept(cwd, env), _output_to(out, err), _stopped_after(timeout):
            try:
                code = main(argv)
            except SystemExit as done:  # argparse's --help
                code = done.code if isinstance(done.code, int) else int(done.code is not None)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(["scalesgd", *argv], code, out.read(), err.read())


@contextlib.contextmanager
def _kept(cwd, env):
    """Run in `cwd` with `env` (None: as they are), and leave this process as it was found."""
    directory, environ = os.getcwd(), dict(os.environ)
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    if cwd is not None:
        os.chdir(cwd)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        yield
    finally:
        os.chdir(directory)
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)


@contextlib.contextmanager
def _output_to(out, err):
    """This process's stdout and stderr, and the descriptors its children inherit, into `out` and `err`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved, streams = (os.dup(1), os.dup(2)), (sys.stdout, sys.stderr)
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        out.flush()
        err.flush()
        sys.stdout, sys.stderr = streams
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


@contextlib.contextmanager
def _stopped_after(timeout: float):
    """Past `timeout`, raise in the command as SIGTERM does: the launcher stops its workers and returns 128 + 14."""
    def stop(signum, _frame):
        raise Stopped(signum)

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
