"""Ring: every rank sends to its right neighbour and receives from its left (HCCL Ring.md).

Schedules (p ranks, n bytes of buffer, chunk = n/p):
- AllReduce = ring ReduceScatter (p-1 steps: send a partial chunk right, reduce the chunk from
  the left with one's own input into the output) + ring AllGather (p-1 steps forwarding reduced
  chunks). Bytes per rank on the wire: 2(p-1)/p * n.
  Cost 2(p-1)a + 2(p-1)/p nb + (p-1)/p ng.
- ReduceScatter: p-1 steps on rank blocks, partials in the scratch buffer, the last step reducing
  straight into the output. Cost (p-1)a + (p-1)/p n(b+g), n = whole input.
- AllGather: p-1 steps forwarding blocks; own block copied locally at step 0.
  Cost (p-1)a + (p-1)/p nb, n = whole output.
- Broadcast: a chain from the root, each rank forwarding the whole buffer. Cost (p-1)(a + nb).
- Reduce: a chain ending at the root, each rank reducing and forwarding. Cost (p-1)(a + nb + ng).
Any p works, powers of two or not; uneven chunks (n not divisible by p) differ by one unit.
Zero-copy safety: in every step the slice a rank writes differs from the slice it exposes.
"""
from __future__ import annotations

from hcomm.steps import Copy, Recv, Send

from .common import INPUT, OUTPUT, SCRATCH, bounds, local_copy, sl

NAME = "ring"
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce")


def allreduce(rank: int, p: int, n: int, unit: int, root: int = 0) -> list:
    if p == 1 or n == 0:
        return local_copy(n, unit)
    b = bounds(n, p)
    right, left = (rank + 1) % p, (rank - 1) % p
    steps = []
    for s in range(p - 1):
        c_send, c_recv = (rank - s) % p, (rank - s - 1) % p
        send_buf = INPUT if s == 0 else OUTPUT
        steps.append((Send(right, sl(send_buf, b[c_send], b[c_send + 1]), (b[c_send + 1] - b[c_send]) * unit),
                      Recv(left, sl(OUTPUT, b[c_recv], b[c_recv + 1]), (b[c_recv + 1] - b[c_recv]) * unit,
                           reduce_with=sl(INPUT, b[c_recv], b[c_recv + 1]))))
    for s in range(p - 1):
        c_send, c_recv = (rank + 1 - s) % p, (rank - s) % p
        steps.append((Send(right, sl(OUTPUT, b[c_send], b[c_send + 1]), (b[c_send + 1] - b[c_send]) * unit),
                      Recv(left, sl(OUTPUT, b[c_recv], b[c_recv + 1]), (b[c_recv + 1] - b[c_recv]) * unit)))
    return steps


def reducescatter(rank: int, p: int, n: int, unit: int, root: int = 0) -> list:
    """Blocks: input and scratch hold p rows of `unit` bytes, output one row."""
    if p == 1:
        return [(Copy(sl(INPUT, 0, 1), sl(OUTPUT, 0, 1), unit),)]
    right, left = (rank + 1) % p, (rank - 1) % p
    steps = []
    for s in range(p - 1):
        c_send, c_recv = (rank - s - 1) % p, (rank - s - 2) % p
        send_buf = INPUT if s == 0 else SCRATCH
        dst = sl(OUTPUT, 0, 1) if s == p - 2 else sl(SCRATCH, c_recv, c_recv + 1)
        steps.append((Send(right, sl(send_buf, c_send, c_send + 1), unit),
                      Recv(left, dst, unit, reduce_with=sl(INPUT, c_recv, c_recv + 1))))
    return steps


def allgather(rank: int, p: int, n: int, unit: int, root: int = 0) -> list:
    """Blocks: input holds one row of `unit` bytes, output p rows."""
    own = (Copy(sl(INPUT, 0, 1), sl(OUTPUT, rank, rank + 1), unit),)
    if p == 1:
        return [own]
    right, left = (rank + 1) % p, (rank - 1) % p
    steps = []
    for s in range(p - 1):
        c_recv = (rank - s - 1) % p
        src = sl(INPUT, 0, 1) if s == 0 else sl(OUTPUT, (rank - s) % p, (rank - s) % p + 1)
        step = (Send(right, src, unit), Recv(left, sl(OUTPUT, c_recv, c_recv + 1), unit))
        steps.append(own + step if s == 0 else step)
    return steps


def broadcast(rank: int, p: int, n: int, unit: int, root: int = 0) -> list:
    if p == 1 or n == 0:
        return local_copy(n, unit)
    pos = (rank - root) % p
    nxt, prev = (rank + 1) % p, (rank - 1) % p
    whole = n * unit
    if pos == 0:
        return [(Send(nxt, sl(INPUT, 0, n), whole), Copy(sl(INPUT, 0, n), sl(OUTPUT, 0, n), whole))]
    steps = [(Recv(prev, sl(OUTPUT, 0, n), whole),)]
    if pos < p - 1:
        steps.append((Send(nxt, sl(OUTPUT, 0, n), whole),))
    return steps


def reduce(rank: int, p: int, n: int, unit: int, root: int = 0) -> list:
    if p == 1 or n == 0:
        return local_copy(n, unit)
    pos = (rank - root - 1) % p          # root+1 starts the chain, the root ends it
    nxt, prev = (rank + 1) % p, (rank - 1) % p
    whole = n * unit
    if pos == 0:
        return [(Send(nxt, sl(INPUT, 0, n), whole),)]
    steps = [(Recv(prev, sl(OUTPUT, 0, n), whole, reduce_with=sl(INPUT, 0, n)),)]
    if pos < p - 1:
        steps.append((Send(nxt, sl(OUTPUT, 0, n), whole),))
    return steps
