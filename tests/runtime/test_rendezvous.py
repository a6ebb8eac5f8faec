"""A local run listens on its rendezvous address alone: nothing on a wildcard or a non-loopback address."""

import ipaddress
import os
import signal
import subprocess
import sys
from pathlib import Path

from scalesgd.bench.faults import workers_of
from tests.train.cli import wait_for_checkpoint

LISTEN = "0A"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _address(hex_addr: str) -> ipaddress._BaseAddress:
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # /proc prints 32-bit words host-endian
    return ipaddress.ip_address(words)


def listening(pid: int) -> list[str]:
    """Every address a process listens on (TCP, IPv4 and IPv6)."""
    mine, found = _socket_inodes(pid), []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in mine:
                found.append(str(_address(fields[1].split(":")[0])))
    return found


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def test_no_socket_of_a_local_run_listens_beyond_loopback(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd", "train", "--run-dir", str(run), "--workers", "2",
                             "--batch-size", "64", "--epochs", "200", "--quiet"],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_checkpoint(run, proc)
        pids = [proc.pid, *workers_of(proc)]
        addresses = [a for pid in pids for a in listening(pid)]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert addresses, "the run's store and gloo listen somewhere"
    assert [a for a in addresses if not _loopback(a)] == []  # no wildcard (0.0.0.0, ::), no external address
