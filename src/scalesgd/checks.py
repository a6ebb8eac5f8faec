"""Rules a single value must meet, each a function from the value to what is wrong with it (None: fine).

Some rules ask this machine (its cores, its free memory, its addresses): they are read when the rule runs,
and those that only hold for a local launch (workers started here, not under torchrun) say so.
"""

from __future__ import annotations

import errno
import ipaddress
import math
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

Check = Callable[[Any], "str | None"]

INT64_MAX = 2**63 - 1  # the largest count torch and numpy hold
FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32: rates, scales and coefficients become such tensors
SEED_MAX = 2**32 - 1  # numpy's generators take seeds in 0..2**32-1
TIMEOUT_MAX_S = 7 * 24 * 3600  # a week: a collective waiting longer is hung, and timedelta and gloo overflow far above
MAX_LOCAL_WORKERS = 256  # processes one local launch starts; more belong to torchrun across machines
WORKER_BYTES = 512 << 20  # what one local worker takes at least: the interpreter, torch, a model and a batch
# the variables torchrun (and our launcher) give every worker (runtime.process_group.launched_by_torchrun)
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

MOUNTS = "/proc/self/mounts"
# file systems the kernel shows its own state in: they take no folders of files
KERNEL_FILESYSTEMS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs",
                                "pstore", "bpf", "devpts", "mqueue", "fusectl", "binfmt_misc", "efivarfs"})


def positive(value) -> str | None:
    return None if value > 0 and _finite(value) else "must be a positive number"


def finite(value) -> str | None:
    """Every number option (each of a list): nan and ±inf pass or fail comparisons by accident, a float past
    float32's range overflows the tensors it becomes (a rate in the optimizer, a scale in a codec), and an int
    past 64 bits overflows torch and the float arithmetic of the schedule."""
    for one in value if isinstance(value, tuple) else (value,):
        if isinstance(one, float) and not math.isfinite(one):
            return "must be a finite number"
        if isinstance(one, float) and abs(one) > FLOAT32_MAX:
            return f"must lie within ±{FLOAT32_MAX:.4g} (float32's range: it becomes a tensor)"
        if isinstance(one, int) and not isinstance(one, bool) and abs(one) > INT64_MAX:
            return f"must lie within ±{INT64_MAX} (a whole number of 64 bits)"
    return None


def launch_problem(environ=os.environ) -> str | None:
    """What is wrong with a launch's environment (torchrun's, or one written by hand), or None: a rank outside the
    world would wait for peers that never come."""
    if not launched(environ):
        return None
    values = {}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if name in environ:
            try:
                values[name] = int(environ[name])
            except ValueError:
                return f"{name}={environ[name]!r} is not a whole number"
    world, rank = values["WORLD_SIZE"], values["RANK"]
    if world < 1:
        return f"WORLD_SIZE={world}: a launch has at least one rank"
    if not 0 <= rank < world:
        return f"RANK={rank} is outside the launch's WORLD_SIZE={world} (ranks 0..{world - 1})"
    local, local_world = values.get("LOCAL_RANK", 0), values.get("LOCAL_WORLD_SIZE", world)
    if not 0 <= local < local_world or local_world > world:
        return (f"LOCAL_RANK={local} with LOCAL_WORLD_SIZE={local_world} does not fit a node of a world of {world} "
                f"(local ranks 0..{local_world - 1}, at most {world} per node)")
    return None


def at_least(low: float, note: str = "") -> Check:
    return lambda value: None if value >= low else f"must be >= {number(low)}{_note(note)}"


def within(low: float, high: float, *, low_open: bool = False, high_open: bool = False, note: str = "") -> Check:
    """low ≤ value ≤ high, either end open; the message writes the interval as (a, b] and so on."""
    def check(value) -> str | None:
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        if above and below:
            return None
        interval = f"{'(' if low_open else '['}{number(low)}, {number(high)}{')' if high_open else ']'}"
        return f"must be in {interval}{_note(note)}"
    return check


def betas(value: tuple) -> str | None:
    """Adam's two decay rates, each in [0, 1)."""
    if len(value) != 2 or not all(0 <= b < 1 for b in value):
        return "give two decay rates β1,β2, each in [0, 1) (e.g. 0.9,0.999)"
    return None


def finite_non_negative(value) -> str | None:
    return None if value >= 0 and _finite(value) else "must be a finite number >= 0"


def seed(value) -> str | None:
    """A seed numpy accepts as well as torch: 0..2**32-1."""
    return within(0, SEED_MAX, note="numpy's seed range")(value)


def timeout(value) -> str | None:
    """Seconds a collective may wait: above 0, and at most a week (longer is a hang, and overflows the clocks)."""
    return within(0, TIMEOUT_MAX_S, low_open=True, note="seconds, at most 7 days")(value)


def threads(low: int = 0, note: str = "") -> Check:
    """Compute threads per process: at most this machine's cores, since more only take turns on them."""
    def check(value) -> str | None:
        cores = os.cpu_count() or 1
        why = f"this machine has {cores} cores; more threads only take turns on them"
        return within(low, cores, note=f"{note}; {why}" if note else why)(value)
    return check


DEVICES = ("auto", "cpu", "cuda")  # where a benchmark computes; auto: the GPU where one is present


def device(value: str) -> str | None:
    """A device to compute on: cuda only where PyTorch sees a CUDA GPU."""
    if value == "cuda" and not torch.cuda.is_available():
        return "needs a CUDA GPU and PyTorch sees none here; choose cpu or auto"
    return None


def resolve_device(value: str):
    """The torch.device that `value` names (auto: the GPU where one is present)."""
    return torch.device("cuda" if value == "cuda" or (value == "auto" and torch.cuda.is_available()) else "cpu")


def device_name(value: str) -> str:
    """The GPU's name, or 'CPU': what a figure measured on `value` was measured on."""
    resolved = resolve_device(value)
    return torch.cuda.get_device_name(resolved) if resolved.type == "cuda" else "CPU"


def local_workers(value) -> str | None:
    """Workers to start: at least one; a local launch at most 256, and as many as the free memory holds (the GPUs
    are checked by the launch itself: `gpus_problem`, so that a config stays a description a GPU host can build)."""
    problem = positive(value)
    if problem or launched():
        return problem  # under torchrun the launch decides the world
    cap, why = local_worker_cap()
    return None if value <= cap else f"must be at most {cap} for a local launch ({why})"


def gpus_problem(workers: int) -> str | None:
    """Why `workers` local processes cannot each train on a GPU of their own here, or None (no GPU: they use the
    CPU); asked by a local launch just before it starts them."""
    gpus = gpus_here()
    if 0 < gpus < workers:
        return (f"must be at most {gpus} here: each worker trains on a GPU of its own and PyTorch sees {gpus}; "
                "or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on the CPU")
    return None


def gpus_here() -> int:
    """The CUDA GPUs PyTorch sees on this host (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_worker_cap() -> tuple[int, str]:
    """The most workers one local launch may start, and why: about 512 MiB each, 256 at most."""
    available = available_memory()
    if available is not None and available // WORKER_BYTES < MAX_LOCAL_WORKERS:
        return (max(1, available // WORKER_BYTES), f"each worker takes about {bytes_text(WORKER_BYTES)} and "
                f"{bytes_text(available)} of memory is available")
    return MAX_LOCAL_WORKERS, f"{MAX_LOCAL_WORKERS} processes on one machine at most; start more with torchrun"


def master_addr(value: str) -> str | None:
    """The rendezvous address: an IP address or localhost; for a local launch one of this machine's, since rank 0
    listens there."""
    if value != "localhost":
        try:
            ipaddress.ip_address(value)
        except ValueError:
            return "must be an IP address (such as 127.0.0.1) or localhost"
    if not launched() and bind_error(value, 0) is not None:
        return "is not an address of this machine; a local launch's workers meet on one of its own (such as 127.0.0.1)"
    return None


def master_port(addr: str, port: int) -> str | None:
    """A local launch's given rendezvous port must be one rank 0 can listen on at `addr` now (0 picks a free one)."""
    if not port or launched():
        return None
    error = bind_error(addr, port)
    if error is None:
        return None
    if error.errno == errno.EADDRINUSE:
        return f"is in use on {addr}; choose a free port, or 0 to pick one"
    return f"cannot be listened on at {addr} ({error.strerror}); choose another port, or 0 to pick one"


def output_dir(value: str) -> str | None:
    """An output directory (empty: the default) must be creatable: neither it nor a folder above it an existing
    file, found before any worker starts rather than when the first result is written."""
    if not value:
        return None
    path = Path(value)
    try:
        for part in (path, *path.parents):
            if part.exists() and not part.is_dir():
                what = "exists" if part == path else f"{part} exists"
                return f"{what} and is not a directory; give a new or existing directory"
    except OSError as err:
        return f"cannot be used ({err.strerror})"
    return writable_dir(value)


def writable_dir(value: str) -> str | None:
    """Why the folder `value` cannot be made or written in, told before any file is: the kernel's own file systems
    (/proc, /sys) take no files, and the nearest folder that exists must be writable."""
    place = _nearest_existing(Path(os.path.abspath(value)))
    kernel = kernel_filesystem(place)
    if kernel is not None:
        mount, kind = kernel
        return f"cannot be created: {mount} is the kernel's {kind} file system, not a place files can be written"
    if not os.access(place, os.W_OK | os.X_OK):
        return f"cannot be created: permission denied ({place} is not writable)"
    return None


def _nearest_existing(path: Path) -> Path:
    """`path`, or the nearest of its parents that exists."""
    return next(part for part in (path, *path.parents) if part.exists())


def kernel_filesystem(path: Path) -> tuple[str, str] | None:
    """(mount point, type) of the kernel file system `path` lies on, or None (another, or no mount table)."""
    real, best = os.path.realpath(path), ("", "")
    try:
        with open(MOUNTS, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[1])  # \040 is a space
                if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[0]):
                    best = (mount, fields[2])
    except OSError:
        return None
    return best if best[1] in KERNEL_FILESYSTEMS else None


def output_file(value: str) -> str | None:
    """A file written at the end of a run (empty: none): its folder must exist now, so hours of training are not
    lost to a typo at the last step."""
    if not value:
        return None
    path = Path(value)
    try:
        if path.is_dir():
            return "is a directory; give a file path"
        if not path.parent.is_dir():
            return f"its folder {path.parent} does not exist; create it first or give another path"
    except OSError as err:
        return f"cannot be used ({err.strerror})"
    return None


def fits_in_memory(nbytes: int) -> str | None:
    """What a launch holds at once must be free now: past it the kernel kills a worker mid-run, unexplained."""
    available = available_memory()
    if available is None or nbytes <= available:
        return None
    return f"{bytes_text(nbytes)} needed, {bytes_text(available)} of memory available"


def each_once(value: tuple) -> str | None:
    """A list, possibly empty: each value once."""
    return None if len(set(value)) == len(value) else "give each value once"


def distinct(value: tuple) -> str | None:
    """A list: at least one value, each once."""
    return "give at least one" if not value else each_once(value)


def each(rule: Check) -> Check:
    """A list whose every value meets `rule` (the first that does not is named)."""
    def check(value: tuple) -> str | None:
        for one in value:
            problem = rule(one)
            if problem:
                return f"{number(one)} {problem}"
        return None
    return check


def all_of(*rules: Check) -> Check:
    """The first problem of several rules, so an option keeps one check."""
    def check(value) -> str | None:
        return next((problem for problem in (rule(value) for rule in rules) if problem), None)
    return check


def problems(values: dict[str, Any], rules: dict[str, Check]) -> dict[str, str]:
    """name → what is wrong, for every value in `values` that breaks its rule."""
    found = {name: rule(values[name]) for name, rule in rules.items()}
    return {name: problem for name, problem in found.items() if problem}


def number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def bytes_text(nbytes: int) -> str:
    """A byte count for messages (1.5 GiB), exact in whole units where a float could not hold it."""
    for unit, shift in (("EiB", 60), ("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            whole = nbytes >> shift
            shown = f"{whole:,}" if whole >= 1 << 20 else f"{nbytes / (1 << shift):.1f}".removesuffix(".0")
            return f"{shown} {unit}"
    return f"{nbytes} B"


# ---- what this machine offers -----------------------------------------------------------------------

def launched(environ=os.environ) -> bool:
    """Whether this process is a worker of a launch (torchrun's or ours): the launch, not a check here, decides
    the workers, addresses and ports."""
    return all(name in environ for name in LAUNCH_VARIABLES)


def processes_here(workers: int) -> int:
    """How many processes on this machine a check's memory is for: a local launch's workers, else this one."""
    return 1 if launched() else workers


def available_memory(meminfo: str | Path = "/proc/meminfo") -> int | None:
    """Bytes this machine can give without swapping (Linux's MemAvailable); None where that is not known."""
    try:
        with open(meminfo, encoding="ascii") as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def bind_error(addr: str, port: int) -> OSError | None:
    """What binding a TCP socket to (addr, port) says, as rank 0's rendezvous will (None: it can)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store does: not past a listener
            probe.bind((addr, port))
    except OSError as err:
        return err
    return None


def _finite(value) -> bool:
    """Not nan or ±inf; a whole number always is (math.isfinite overflows on one past a float's range)."""
    return not isinstance(value, float) or math.isfinite(value)


def _note(note: str) -> str:
    return f" ({note})" if note else ""
