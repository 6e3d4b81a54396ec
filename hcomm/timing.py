"""The timing model: replay every rank's step list on a topology in simulated time (integer ns).

Rules (DESIGN.md "Simulated time"):
- A rank posts step i when step i-1 has completed; at post its local ops (Copy, Stage) queue on
  the rank's device engine, and its Sends and Recvs wait for their partners.
- A transfer is ready when both sides have posted it (plus one notify for the receiver's
  "ready" handshake). Transfers are granted ports in simulated-time order, ties broken by sender
  rank, then receiver rank, then sequence number: start = max(ready, egress port free, ingress port free); the ports
  are then busy for bytes / bottleneck bandwidth; data arrives route latency later.
- A reducing receive then occupies the receiver's device engine for the reduction (free where the
  DMA engine reduces inline). A receive completes when its data is in place; the matching send
  completes when the receiver has consumed it, plus one notify (the zero-copy ack).
- A step completes at the latest completion of its operations.

The same replay, given buffers, also moves the data in that order: it is how schedules are
verified symbolically (contributions counted per element, zero-copy hazards and deadlocks
detected) and how payload-free timing and real execution agree.
"""
from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from topologies.errors import HcclError

from .steps import Copy, Recv, Send, Stage


class _Rank:
    __slots__ = ("steps", "index", "clock", "pending", "step_end", "outstanding")

    def __init__(self, steps, clock):
        self.steps = steps
        self.index = 0
        self.clock = clock
        self.pending = 0
        self.step_end = clock
        self.outstanding = []   # (Slice) exposed by this step's sends, for hazard checks


def replay(schedules, entry_ns, topo, dtype: str = "float32", redop: str | None = "sum",
           buffers=None, reduce_fn=None, events: list | None = None, check_hazards: bool = False,
           op_name: str = "op"):
    """Replay per-rank schedules; return every rank's exit clock (ns).

    Args:
        schedules: one list of steps per rank.
        entry_ns: every rank's clock at entry.
        topo: the Topology whose routes, ports and device model price the steps.
        dtype, redop: what a reduction reduces (decides inline reduce on hardware presets).
        buffers: optional per-rank dict name -> ndarray; if given, data is moved as well.
        reduce_fn: f(a, b, out) used for reducing receives when buffers are given.
        events: optional list to append Chrome-trace-like (rank, name, start_ns, end_ns, args).
        check_hazards: raise if a rank writes a slice its unconsumed sends expose.
    """
    p = len(schedules)
    ranks = [_Rank(s, int(t)) for s, t in zip(schedules, entry_ns)]
    dm = topo.device_model
    engine_free = [0] * p
    port_free = {}
    unmatched_sends, unmatched_recvs = {}, {}
    heap = []
    seq = [0]

    def write_check(r, sl):
        if check_hazards:
            for exposed in ranks[r].outstanding:
                if exposed.overlaps(sl):
                    raise HcclError("E_INTERNAL", f"zero-copy hazard: step {ranks[r].index} writes {sl} "
                                    f"while its send of {exposed} is not yet consumed", rank=r, op=op_name)

    def local(r, op, t):
        if isinstance(op, Copy):
            cost = dm.copy_ns(op.nbytes)
            if buffers is not None:
                write_check(r, op.dst)
                b = buffers[r]
                np.copyto(b[op.dst.buf][op.dst.start:op.dst.stop], b[op.src.buf][op.src.start:op.src.stop])
            name = "copy"
        else:
            cost = dm.copy_ns(op.nbytes)
            name = f"stage-{op.direction}"
        start = max(t, engine_free[r])
        end = engine_free[r] = start + cost
        if events is not None and cost:
            events.append((r, name, start, end, {"bytes": op.nbytes}))
        return end

    def match(src, dst, send_post, send_op, recv_post, recv_op):
        if send_op.nbytes != recv_op.nbytes:
            raise HcclError("E_INTERNAL", f"schedule mismatch: rank {src} sends {send_op.nbytes} B to rank {dst}, "
                            f"which expects {recv_op.nbytes} B", op=op_name)
        ready = max(send_post, recv_post) + topo.notify_ns(src, dst)
        seq[0] += 1
        heapq.heappush(heap, (ready, src, dst, seq[0], send_op, recv_op))

    def post(r):
        rk = ranks[r]
        while rk.index < len(rk.steps):
            step = rk.steps[rk.index]
            t = rk.clock
            end, pending = t, 0
            rk.outstanding = []
            for op in step:
                if isinstance(op, Send):
                    key = (r, op.peer)
                    waiting = unmatched_recvs.get(key)
                    if waiting:
                        rt, rop = waiting.popleft()
                        match(r, op.peer, t, op, rt, rop)
                    else:
                        unmatched_sends.setdefault(key, deque()).append((t, op))
                    if check_hazards:
                        rk.outstanding.append(op.src)
                    pending += 1
                elif isinstance(op, Recv):
                    key = (op.peer, r)
                    waiting = unmatched_sends.get(key)
                    if waiting:
                        st, sop = waiting.popleft()
                        match(op.peer, r, st, sop, t, op)
                    else:
                        unmatched_recvs.setdefault(key, deque()).append((t, op))
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
        ready, src, dst, _, sop, rop = heapq.heappop(heap)
        route = topo.route(src, dst)
        wire = route.cost_ns(sop.nbytes) - route.latency_ns
        start = max(ready, port_free.get(("out",) + route.egress, 0), port_free.get(("in",) + route.ingress, 0))
        port_free[("out",) + route.egress] = port_free[("in",) + route.ingress] = start + wire
        arrive = start + wire + route.latency_ns
        done = arrive
        if buffers is not None:
            write_check(dst, rop.dst)
            view = buffers[src][sop.src.buf][sop.src.start:sop.src.stop]
            out = buffers[dst][rop.dst.buf][rop.dst.start:rop.dst.stop]
            if rop.reduce_with is not None:
                w = rop.reduce_with
                reduce_fn(view, buffers[dst][w.buf][w.start:w.stop], out)
            else:
                np.copyto(out, view)
        if rop.reduce_with is not None:
            cost = dm.reduce_ns(rop.nbytes, dtype, redop)
            if cost:
                rstart = max(arrive, engine_free[dst])
                done = engine_free[dst] = rstart + cost
                if events is not None:
                    events.append((dst, "reduce", rstart, done, {"bytes": rop.nbytes, "from": src}))
        if events is not None:
            events.append((src, f"send->{dst}", start, arrive, {"bytes": sop.nbytes, "link": route.kind}))
            events.append((dst, f"recv<-{src}", start, arrive, {"bytes": sop.nbytes, "link": route.kind}))
        finish(dst, done)
        finish(src, done + topo.notify_ns(dst, src))

    stuck = [r for r, rk in enumerate(ranks) if rk.index < len(rk.steps)]
    if stuck:
        r = stuck[0]
        rk = ranks[r]
        peers = sorted({op.peer for op in rk.steps[rk.index] if isinstance(op, (Send, Recv))})
        raise HcclError("E_INTERNAL", f"schedule deadlock: ranks {stuck[:16]} never complete; rank {r} is stuck in "
                        f"step {rk.index} waiting on peers {peers}", op=op_name)
    return [rk.clock for rk in ranks]

