"""The timing model's reference implementation: replay every rank's step list as discrete events.

Rules (DESIGN.md "Simulated time"):
- A rank posts step i when step i-1 has completed; at post its local ops (Copy, Stage) queue on
  the rank's device engine, and its Sends and Recvs wait for their partners.
- A transfer is ready when both sides have posted it (plus one notify for the receiver's
  "ready" handshake). Transfers are granted ports in simulated-time order, ties broken by the
  order the algorithm issues them in its step (a mesh issues peer i+1 first, then i+2, ...), then
  sender rank, then receiver rank: start = max(ready, egress port free, ingress port free); the ports are then busy for bytes / bottleneck bandwidth; data arrives route
  latency later.
- Reducing receives from one sender in one step are a batch (HCCL writes them to the peer's
  scratch and notifies once): when the last has arrived, the receiver's device engine reduces
  them in turn (free where the DMA engine reduces inline), and the batch completes.
- A receive completes when its data is in place (its batch reduced); the matching send
  completes when the receiver has consumed it, plus one notify (the zero-copy ack).
- A step completes at the latest completion of its operations.

hcomm.vtiming computes the same times vectorised over ranks; tests hold the two equal.
"""
from __future__ import annotations

import heapq
from collections import deque

from topologies.errors import HcclError

from .steps import Copy, Recv, Send, Stage


class _Rank:
    __slots__ = ("steps", "index", "clock", "pending", "step_end")

    def __init__(self, steps, clock):
        self.steps = steps
        self.index = 0
        self.clock = clock
        self.pending = 0
        self.step_end = clock


class _Batch:
    __slots__ = ("count", "arrived", "last", "members")

    def __init__(self, count):
        self.count, self.arrived, self.last, self.members = count, 0, 0, []


def replay(schedules, entry_ns, topo, dtype: str = "float32", redop: str | None = "sum",
           events: list | None = None, op_name: str = "op"):
    """Replay per-rank step lists; return every rank's exit clock (ns).

    Args:
        schedules: one list of steps (tuples of hcomm.steps ops) per rank.
        entry_ns: every rank's clock at entry.
        topo: the Topology whose routes, ports and device model price the steps.
        dtype, redop: what a reduction reduces (decides inline reduce on hardware presets).
        events: optional list to append Chrome-trace-like (rank, name, start_ns, end_ns, args).
    """
    p = len(schedules)
    ranks = [_Rank(s, int(t)) for s, t in zip(schedules, entry_ns)]
    dm = topo.device_model
    engine_free = [0] * p
    port_free = {}
    unmatched_sends, unmatched_recvs = {}, {}
    heap = []
    seq = [0]
    batches = {}

    def local(r, op, t):
        cost = dm.copy_ns(op.nbytes)
        start = max(t, engine_free[r])
        end = engine_free[r] = start + cost
        if events is not None and cost:
            events.append((r, "copy" if isinstance(op, Copy) else f"stage-{op.direction}", start, end,
                           {"bytes": op.nbytes}))
        return end

    def match(src, dst, send_post, send_op, recv_post, recv_op, batch):
        if send_op.nbytes != recv_op.nbytes:
            raise HcclError("E_INTERNAL", f"schedule mismatch: rank {src} sends {send_op.nbytes} B to rank {dst}, "
                            f"which expects {recv_op.nbytes} B", op=op_name)
        ready = max(send_post, recv_post) + topo.notify_ns(src, dst)
        seq[0] += 1
        heapq.heappush(heap, (ready, send_op.order, src, dst, seq[0], send_op, recv_op, batch))

    def post(r):
        rk = ranks[r]
        while rk.index < len(rk.steps):
            step = rk.steps[rk.index]
            t = rk.clock
            end, pending = t, 0
            counts = {}
            for op in step:
                if isinstance(op, Recv) and op.reduce_with is not None:
                    counts[op.peer] = counts.get(op.peer, 0) + 1
            for peer, count in counts.items():
                batches[(r, peer, rk.index)] = _Batch(count)
            for op in step:
                if isinstance(op, Send):
                    key = (r, op.peer)
                    waiting = unmatched_recvs.get(key)
                    if waiting:
                        rt, rop, batch = waiting.popleft()
                        match(r, op.peer, t, op, rt, rop, batch)
                    else:
                        unmatched_sends.setdefault(key, deque()).append((t, op))
                    pending += 1
                elif isinstance(op, Recv):
                    key = (op.peer, r)
                    batch = batches[(r, op.peer, rk.index)] if op.reduce_with is not None else None
                    waiting = unmatched_sends.get(key)
                    if waiting:
                        st, sop = waiting.popleft()
                        match(op.peer, r, st, sop, t, op, batch)
                    else:
                        unmatched_recvs.setdefault(key, deque()).append((t, op, batch))
                    pending += 1
            for op in step:
                if isinstance(op, (Copy, Stage)):
                    end = max(end, local(r, op, t))
            if pending == 0:
                rk.clock = end
                rk.index += 1
                continue
            rk.pending, rk.step_end = pending, end
            return

    def finish(r, t):
        rk = ranks[r]
        if t > rk.step_end:
            rk.step_end = t
        rk.pending -= 1
        if rk.pending == 0:
            rk.clock = rk.step_end
            rk.index += 1
            post(r)

    for r in range(p):
        post(r)

    while heap:
        ready, _, src, dst, _, sop, rop, batch = heapq.heappop(heap)
        route = topo.route(src, dst)
        wire = route.cost_ns(sop.nbytes) - route.latency_ns
        start = max(ready, port_free.get(("out",) + route.egress, 0), port_free.get(("in",) + route.ingress, 0))
        port_free[("out",) + route.egress] = port_free[("in",) + route.ingress] = start + wire
        arrive = start + wire + route.latency_ns
        if events is not None:
            events.append((src, f"send->{dst}", start, arrive, {"bytes": sop.nbytes, "link": route.kind}))
            events.append((dst, f"recv<-{src}", start, arrive, {"bytes": sop.nbytes, "link": route.kind}))
        if batch is None:
            finish(dst, arrive)
            finish(src, arrive + topo.notify_ns(dst, src))
            continue
        batch.arrived += 1
        batch.last = max(batch.last, arrive)
        batch.members.append((src, rop))
        if batch.arrived < batch.count:
            continue
        cost = sum(dm.reduce_ns(op.nbytes, dtype, redop) for _, op in batch.members)
        done = batch.last
        if cost:
            rstart = max(batch.last, engine_free[dst])
            done = engine_free[dst] = rstart + cost
            if events is not None:
                events.append((dst, "reduce", rstart, done, {"bytes": sum(op.nbytes for _, op in batch.members),
                                                            "from": src}))
        for member_src, _ in batch.members:
            finish(dst, done)
            finish(member_src, done + topo.notify_ns(dst, member_src))

    stuck = [r for r, rk in enumerate(ranks) if rk.index < len(rk.steps)]
    if stuck:
        r = stuck[0]
        rk = ranks[r]
        peers = sorted({op.peer for op in rk.steps[rk.index] if isinstance(op, (Send, Recv))})
        raise HcclError("E_INTERNAL", f"schedule deadlock: ranks {stuck[:16]} never complete; rank {r} is stuck in "
                        f"step {rk.index} waiting on peers {peers}", op=op_name)
    return [rk.clock for rk in ranks]
