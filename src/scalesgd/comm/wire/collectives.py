"""Allreduce algorithms built from torch.distributed point-to-point primitives, each written once as steps.

Every step posts a receive and a send together (batched on NCCL) so a link carries data both ways
at once; gloo's own `all_to_all_single`/`all_gather` do not (measured: they take twice the full-duplex
time). All algorithms sum in place, like `dist.all_reduce`, on any backend and any dtype torch can add,
and return the number of bytes this rank sent. As steps (`scalesgd.comm.wire.pipeline`), several run
interleaved, which is how the engine pipelines the pieces of a bucket.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scalesgd.comm.wire.pipeline import Steps, run_steps
from scalesgd.comm.wire.topology import Topology, TopologyGroups
from scalesgd.registry import Registry


@dataclass(frozen=True)
class Algorithm:
    """An allreduce: `steps(flat, group, topology, tag)` sums a contiguous 1-D tensor in place, as steps that
    return the bytes sent."""

    steps: Callable[[torch.Tensor, object, "Topology | TopologyGroups | None", int], Steps]
    help: str
    needs_topology: bool = False  # runs in the node and cross-node groups


ALGORITHMS: Registry[Algorithm] = Registry("allreduce algorithm")


def allreduce(tensor: torch.Tensor, algorithm: str = "ring", group=None,
              topology: Topology | TopologyGroups | None = None) -> int:
    """Sum `tensor` in place across the ranks of `group` with a registered algorithm; return the bytes sent.

    `native` is `dist.all_reduce` (its bytes are the ring estimate 2·(p−1)/p·nbytes). `hierarchical`
    runs in the node and cross-node groups of `topology`: prebuilt `TopologyGroups` (what the engine
    passes, created eagerly at start-up), or a `Topology` whose groups are built on first use over the
    default group (default `Topology.from_env()`).
    """
    return run_steps(allreduce_steps(tensor, algorithm, group, topology))


def allreduce_steps(tensor: torch.Tensor, algorithm: str = "ring", group=None,
                    topology: Topology | TopologyGroups | None = None, tag: int = 0) -> Steps:
    """`allreduce` as steps, its messages under `tag` (pieces in flight at once need distinct tags)."""
    steps = ALGORITHMS[algorithm].steps
    rank, peers = ring_members(group)
    if rank < 0 or len(peers) == 1:  # not a member (as dist.all_reduce: nothing to do) or alone
        return 0
    work = tensor.contiguous()  # the collectives need contiguous memory; copied back below
    sent = yield from steps(work.view(-1), group, topology, tag)
    if work is not tensor:
        tensor.copy_(work)
    return sent


def _native_steps(flat: torch.Tensor, group, topology=None, tag: int = 0) -> Steps:
    """torch.distributed's own all_reduce, posted as one step (its bytes: the ring estimate)."""
    yield [dist.all_reduce(flat, group=group, async_op=True)]
    p = dist.get_world_size(group)
    return 2 * (p - 1) * flat.numel() * flat.element_size() // p


def broadcast_object(obj, src: int = 0, group=None):
    """The Python object of `group`'s rank `src` on every rank of `group` (default: the whole world)."""
    box = [obj]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, src) if group is not None else src, group=group)
    return box[0]


# --- shared pieces ---------------------------------------------------------------------------------

def ring_members(group) -> tuple[int, list[int]]:
    """This rank's rank in `group` and the group ranks of all members (-1 and [] when not a member)."""
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        return rank, []
    return rank, list(range(dist.get_world_size(group)))


def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Split n elements into `parts` contiguous near-equal ranges (the first n % parts one longer)."""
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (i < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def chunks_of(flat: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """Views of `flat` cut by `chunk_bounds`, so every phase and every rank agree on the cut."""
    return [flat[a:b] for a, b in chunk_bounds(flat.numel(), parts)]


def post(group, send: torch.Tensor | None = None, dst: int | None = None,
         recv: torch.Tensor | None = None, src: int | None = None, tag: int = 0) -> tuple[list, int]:
    """Post a receive and a send with group ranks `src`/`dst` together; return their works and the bytes sent.

    Empty tensors are skipped; both sides of a message compute the same size, so a skipped send
    always meets a skipped receive and nobody waits for a message that never comes. CUDA tensors (NCCL)
    need the pair batched (separate calls can deadlock a ring); on gloo the process group's own send/recv
    are used, as the `dist.isend` wrappers cost a fixed Python overhead per step that dominates
    small messages. `tag` keeps messages of pieces in flight at once apart (gloo; NCCL keeps order).
    """
    pg = dist.group.WORLD if group is None else group
    recv = recv if recv is not None and recv.numel() else None
    send = send if send is not None and send.numel() else None
    if (send if send is not None else recv) is not None and (send if send is not None else recv).is_cuda:
        ops = ([dist.P2POp(dist.irecv, recv, dist.get_global_rank(pg, src), pg, tag)] if recv is not None else []) + \
              ([dist.P2POp(dist.isend, send, dist.get_global_rank(pg, dst), pg, tag)] if send is not None else [])
        works = dist.batch_isend_irecv(ops) if ops else []
    else:
        works = ([pg.recv([recv], src, tag)] if recv is not None else []) + \
                ([pg.send([send], dst, tag)] if send is not None else [])
    return works, send.numel() * send.element_size() if send is not None else 0


def receives_ahead(like: torch.Tensor) -> bool:
    """Whether a ring posts each step's receive a step ahead: on gloo, whose send of a message waits until the
    receiver's announcement of its receive arrives, so a receive posted with its step's send costs each step a
    round trip rather than a one-way delay (a 51 ms round trip: 6 steps of a 4-rank ring, 0.15 s a bucket).
    NCCL batches each step's pair instead (`post`)."""
    return not like.is_cuda


def ring_scratch(width: int) -> int:
    """Elements of scratch a ring reduce-scatter over chunks of at most `width` works in without allocating: two
    chunks, one receiving a step ahead while the other is added (`receives_ahead`)."""
    return 2 * width


def receive(group, into: torch.Tensor, src: int, tag: int = 0) -> list:
    """Post a receive alone (gloo), to be waited for with a later step's works; nothing for an empty tensor."""
    pg = dist.group.WORLD if group is None else group
    return [pg.recv([into], src, tag)] if into.numel() else []


def send_recv(group, send: torch.Tensor | None = None, dst: int | None = None,
              recv: torch.Tensor | None = None, src: int | None = None) -> int:
    """One blocking step: `post` the pair, wait for both; returns the bytes sent."""
    works, sent = post(group, send, dst, recv, src)
    for work in works:
        work.wait()
    return sent


def _add_into(into: torch.Tensor, incoming: torch.Tensor) -> None:
    into.add_(incoming)


def ring_reduce_scatter_steps(chunks: list[torch.Tensor], rank: int, peers: list[int], group,
                              buf: torch.Tensor, combine=_add_into, tag: int = 0, last=None) -> Steps:
    """p−1 ring steps after which this rank's chunk `chunks[rank]` holds the sum over the ring.

    `combine(into, incoming)` adds a received chunk in place (the fp8 sum passes its saturating add). On gloo
    each step's receive is posted a step ahead (`receives_ahead`), alternating between `buf` and a second
    buffer (`buf`'s second half where it holds two chunks), and `last()` posts what follows (the allgather's
    first receive) as the last step starts.
    """
    p = len(chunks)
    right, left = peers[(rank + 1) % p], peers[(rank - 1) % p]
    sent = 0
    if p == 1:
        return sent
    if not receives_ahead(chunks[rank]):
        for step in range(p - 1):
            out, into = chunks[(rank - step - 1) % p], chunks[(rank - step - 2) % p]
            incoming = buf[:into.numel()]
            works, n = post(group, out, right, incoming, left, tag)
            yield works
            sent += n
            combine(into, incoming)
        return sent
    width = max(c.numel() for c in chunks)
    bufs = (buf, buf[width:ring_scratch(width)] if buf.numel() >= ring_scratch(width) else buf.new_empty(width))
    into_at = [chunks[(rank - step - 2) % p] for step in range(p - 1)]
    ahead = receive(group, bufs[0][:into_at[0].numel()], left, tag)
    for step in range(p - 1):
        incoming = bufs[step % 2][:into_at[step].numel()]
        works = ahead
        ahead = receive(group, bufs[(step + 1) % 2][:into_at[step + 1].numel()], left, tag) if step + 2 < p else []
        if step + 2 == p and last is not None:
            last()
        sending, n = post(group, send=chunks[(rank - step - 1) % p], dst=right, tag=tag)
        yield works + sending
        sent += n
        combine(into_at[step], incoming)
    return sent


def ring_reduce_scatter_rows_steps(flat: torch.Tensor, group, buf: torch.Tensor | None = None, combine=_add_into,
                                   tag: int = 0) -> Steps:
    """The sum over `group` of `flat`'s p equal rows, ending in this rank's row (FSDP lays a reduce-scatter's input so):
    p−1 ring steps of a row each, half a ring allreduce's bytes (gloo's own reduce-scatter sends an allreduce's)."""
    rank, peers = ring_members(group)
    rows = list(flat.view(len(peers), -1))
    if buf is None:
        buf = flat.new_empty(ring_scratch(rows[0].numel()))
    return (yield from ring_reduce_scatter_steps(rows, rank, peers, group, buf, combine, tag))


def ring_allgather_steps(chunks: list[torch.Tensor], rank: int, peers: list[int], group, tag: int = 0,
                        first: list | None = None) -> Steps:
    """p−1 ring steps that pass every rank's chunk `chunks[rank]` to all others, received in place (on gloo each
    receive posted a step ahead: `receives_ahead`; `first`, the works of the first one where it is posted)."""
    p = len(chunks)
    right, left = peers[(rank + 1) % p], peers[(rank - 1) % p]
    sent = 0
    if p == 1:
        return sent
    if not receives_ahead(chunks[rank]):
        for step in range(p - 1):
            works, n = post(group, chunks[(rank - step) % p], right, chunks[(rank - step - 1) % p], left, tag)
            yield works
            sent += n
        return sent
    ahead = first if first is not None else receive(group, chunks[(rank - 1) % p], left, tag)
    for step in range(p - 1):
        works = ahead
        ahead = receive(group, chunks[(rank - step - 2) % p], left, tag) if step + 2 < p else []
        sending, n = post(group, send=chunks[(rank - step) % p], dst=right, tag=tag)
        yield works + sending
        sent += n
    return sent


def ring_allreduce_steps(flat: torch.Tensor, group, buf: torch.Tensor | None = None, combine=_add_into,
                         tag: int = 0) -> Steps:
    """Reduce-scatter then allgather around the ring of `group`: 2(p−1) steps of n/p elements."""
    rank, peers = ring_members(group)
    p = len(peers)
    if p == 1:
        return 0
    chunks = chunks_of(flat, p)
    if buf is None:
        buf = flat.new_empty(ring_scratch(chunks[0].numel()))  # the first chunk is the longest: one buffer per call
    first: list = []  # the allgather's first receive, posted as the reduce-scatter's last step starts: its chunk
    # was last read by the reduce-scatter's first send, and the left peer sends into it only once its own sum is done
    # (NCCL posts each step's pair together: `last` is never called and `first` stays unused)

    def post_first() -> None:
        first.extend(receive(group, chunks[(rank - 1) % p], peers[(rank - 1) % p], tag))

    sent = yield from ring_reduce_scatter_steps(chunks, rank, peers, group, buf, combine, tag, last=post_first)
    return sent + (yield from ring_allgather_steps(chunks, rank, peers, group, tag, first=first))


# --- halving/doubling (Rabenseifner) ---------------------------------------------------------------

def _halving_doubling_steps(flat: torch.Tensor, group, topology=None, tag: int = 0) -> Steps:
    """Recursive-halving reduce-scatter then recursive-doubling allgather: 2·log2 p′ steps (+2 to fold).

    With p not a power of two, the first 2r ranks (r = p − p′) pair up: each even rank hands its
    vector to the odd one and sits out, then gets the result back at the end.
    """
    rank, peers = ring_members(group)
    p = len(peers)
    p2 = 1 << (p.bit_length() - 1)
    r = p - p2
    n = flat.numel()
    if rank < 2 * r and rank % 2 == 0:  # folded away: contribute, then receive the result
        works, sent = post(group, send=flat, dst=peers[rank + 1], tag=tag)
        yield works
        works, _ = post(group, recv=flat, src=peers[rank + 1], tag=tag)
        yield works
        return sent
    vrank = rank // 2 if rank < 2 * r else rank - r  # rank among the p′ that run the core

    def real(v: int) -> int:
        return peers[2 * v + 1 if v < r else v + r]

    bounds = chunk_bounds(n, p2)

    def span(lo: int, hi: int) -> torch.Tensor:  # elements of blocks lo … hi−1
        return flat[bounds[lo][0]:bounds[hi - 1][1]]

    fold_in = rank < 2 * r
    buf = flat.new_empty(n if fold_in else bounds[p2 // 2 - 1][1])  # largest receive of this call
    sent = 0
    if fold_in:
        works, _ = post(group, recv=buf, src=peers[rank - 1], tag=tag)
        yield works
        flat.add_(buf)
    lo, hi, d = 0, p2, p2 // 2
    while d:  # reduce-scatter: keep the half of [lo, hi) on our side of bit `d`
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if not vrank & d else ((mid, hi), (lo, mid))
        mine = span(*keep)
        incoming = buf[:mine.numel()]
        works, nbytes = post(group, span(*give), real(vrank ^ d), incoming, real(vrank ^ d), tag)
        yield works
        sent += nbytes
        mine.add_(incoming)
        lo, hi = keep
        d //= 2
    d = 1
    while d < p2:  # allgather: swap our aligned run of `d` blocks with the partner's
        partner = vrank ^ d
        theirs = (partner // d) * d
        works, nbytes = post(group, span(lo, hi), real(partner), span(theirs, theirs + d), real(partner), tag)
        yield works
        sent += nbytes
        lo, hi = min(lo, theirs), max(hi, theirs + d)
        d *= 2
    if fold_in:
        works, nbytes = post(group, send=flat, dst=peers[rank - 1], tag=tag)
        yield works
        sent += nbytes
    return sent


# --- hierarchical (Goyal et al., Oyama et al.) -----------------------------------------------------

def _hierarchical_steps(flat: torch.Tensor, group, topology: Topology | TopologyGroups | None,
                        tag: int = 0) -> Steps:
    """Reduce-scatter in the node, ring-allreduce each part across nodes, allgather in the node.

    Only the inter-node phase crosses the network, carrying 1/P′ of the vector per rank.
    """
    if isinstance(topology, TopologyGroups):
        groups = topology
    else:
        if group is not None and group is not dist.group.WORLD:
            raise ValueError("hierarchical allreduce over a subgroup needs prebuilt TopologyGroups; "
                             "a Topology builds its groups over the default group")
        groups = (Topology.from_env() if topology is None else topology).groups()
    rank, peers = ring_members(groups.node_group)
    chunks = chunks_of(flat, len(peers))
    buf = flat.new_empty(ring_scratch(chunks[0].numel()))
    sent = yield from ring_reduce_scatter_steps(chunks, rank, peers, groups.node_group, buf, tag=tag)
    sent += yield from ring_allreduce_steps(chunks[rank], groups.cross_group, buf, tag=tag)
    return sent + (yield from ring_allgather_steps(chunks, rank, peers, groups.node_group, tag))


ALGORITHMS.add("ring", Algorithm(lambda flat, group, topology, tag: ring_allreduce_steps(flat, group, tag=tag),
                                 "reduce-scatter then allgather around a ring, 2(p−1) steps"))
ALGORITHMS.add("halving_doubling", Algorithm(_halving_doubling_steps,
                                             "recursive halving then doubling, 2·log2 p steps"))
ALGORITHMS.add("hierarchical", Algorithm(_hierarchical_steps, "in the node, across nodes, back",
                                         needs_topology=True))
ALGORITHMS.add("native", Algorithm(_native_steps, "torch.distributed's own all_reduce"))
