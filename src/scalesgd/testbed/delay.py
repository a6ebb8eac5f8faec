"""Added delay without netem (this kernel has none): a forwarder in user space between a node's link and the
switch, holding each frame the node sends for the delay, the other way passing frames on at once. The rate stays
tbf's, before it on the way out and after it on the way in, so a frame waits in the shaper, then in the delay.

Frames cross as the kernel holds them (AF_PACKET with virtio-net headers, so a segmentation-offloaded burst of
64 kB crosses as one frame, as a tap device's do): one system call a burst, not a packet. A fixed delay keeps the
frames' order, so the held frames are a queue, not a heap.

    ip netns exec SWITCH python -m scalesgd.testbed.delay NODE_SIDE SWITCH_SIDE SECONDS
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import socket
import sys
import time
from collections import deque

SOL_PACKET, PACKET_VNET_HDR, PACKET_IGNORE_OUTGOING = 263, 15, 23  # linux/if_packet.h
ETH_P_ALL = 0x0003
SO_RCVBUFFORCE = 33
RECEIVE_BUFFER = 16 << 20  # frames that arrive while the forwarder waits for a core (2 shared ones) wait here
LARGEST = 1 << 18  # a GSO burst (64 kB by default, more with BIG TCP) and its header
PRIORITY = 10  # real-time (SCHED_FIFO): the frames leave on time while training fills the cores
DROPPED = (errno.ENOBUFS, errno.EAGAIN, errno.ENETDOWN, errno.ENXIO, errno.EMSGSIZE)  # as a full or downed link


class DelayLine:
    """Frames held `delay_s` each, released in the order they came."""

    def __init__(self, delay_s: float):
        if not delay_s >= 0:
            raise ValueError(f"delay_s {delay_s!r}: give seconds, 0 or more")
        self.delay_s = delay_s
        self._held: deque[tuple[float, bytes]] = deque()

    def hold(self, frame: bytes, now: float) -> None:
        self._held.append((now + self.delay_s, frame))

    def due(self, now: float) -> list[bytes]:
        """The frames whose delay is over at `now`, oldest first (taken out of the line)."""
        out = []
        while self._held and self._held[0][0] <= now:
            out.append(self._held.popleft()[1])
        return out

    def wait_s(self, now: float) -> float | None:
        """Seconds until the next frame is due (None: none held)."""
        return max(0.0, self._held[0][0] - now) if self._held else None

    def __len__(self) -> int:
        return len(self._held)


def open_port(name: str) -> socket.socket:
    """A raw socket on interface `name`: every frame it receives (not those it sends), with its offload header."""
    port = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    port.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    port.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    try:
        port.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER)
    except PermissionError:  # not root: the default buffer
        pass
    port.bind((name, 0))
    port.setblocking(False)
    return port


def forward(node_side: str, switch_side: str, delay_s: float, ready=None) -> None:
    """Frames from `node_side` to `switch_side` after `delay_s`, frames back at once, until SIGTERM."""
    inbound, outbound = open_port(node_side), open_port(switch_side)
    line, selector = DelayLine(delay_s), selectors.DefaultSelector()
    selector.register(inbound, selectors.EVENT_READ, "out")
    selector.register(outbound, selectors.EVENT_READ, "in")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if ready is not None:
        ready()
    while True:
        for key, _ in selector.select(line.wait_s(time.monotonic())):
            for frame in _drain(key.fileobj):
                if key.data == "out":
                    line.hold(frame, time.monotonic())
                else:
                    _send(inbound, frame)
        for frame in line.due(time.monotonic()):
            _send(outbound, frame)


def _drain(port: socket.socket) -> list[bytes]:
    frames = []
    while True:
        try:
            frames.append(port.recv(LARGEST))
        except (BlockingIOError, InterruptedError):
            return frames
        except OSError as error:  # the link taken down (a fault the testbed plays): nothing to read now
            if error.errno in DROPPED:
                return frames
            raise


def _send(port: socket.socket, frame: bytes) -> None:
    try:
        port.send(frame)
    except OSError as error:  # a full shaper queue or a downed link drops it, as the kernel's own path would
        if error.errno not in DROPPED:
            raise


def _realtime() -> None:
    """Run ahead of training on the shared cores (a delay element late by a scheduler's slice is not one)."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(PRIORITY))
    except (PermissionError, AttributeError, OSError):
        pass


def main(argv: list[str] | None = None) -> None:
    node_side, switch_side, seconds = argv if argv is not None else sys.argv[1:]
    _realtime()
    forward(node_side, switch_side, float(seconds), ready=lambda: print("ready", flush=True))


if __name__ == "__main__":
    main()
