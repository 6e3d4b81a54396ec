"""The timing model's reference implementation: replay every rank's step list as discrete events.

Rules (docs/design.md, "Simulated time and the cost model"):
- A rank posts step i when step i-1 has completed; at post its local ops (Copy, Stage) queue on
  the rank's device engine, and its Sends and Recvs wait for their partners.
- A transfer is ready when both sides have posted it (plus one notify for the receiver's
  "ready" handshake). Each port serves its step's transfers in the order the algorithm issues
  them (a mesh issues peer i+1 first, then i+2, ...; then sender, receiver): a transfer is
  granted when it heads the queues of both its ports and starts at max(ready, egress port free,
  ingress port free); the ports are then busy for bytes / the route's port bandwidth, and the data
  arrives bytes / its bottleneck bandwidth plus the route latency later. Where one pair cannot fill
  a port (port bandwidth above bandwidth: A3's UB) a port's next transfer starts before its last
  has arrived, and a pair's next transfer still waits for the pair's last (one pair at a time runs
  at one pair's rate).
- Reducing receives from one sender in one step are a batch (HCCL writes them to the peer's
  scratch and notifies once); once a step's reducing receives have all arrived, the receiver's
  device engine reduces the batches in issue order, each starting no earlier than its last
  arrival (free where the DMA engine reduces inline).
- A receive completes when its data is in place (its batch reduced); the matching send
  completes when the receiver has consumed it, plus one notify (the zero-copy ack).
- A step completes at the latest completion of its operations.
- Under a link state (hcomm.link_state) a transfer is retransmitted over down links and slowed over
  slowed ones; a corrupted transfer (the pair's k-th of the op, `corrupt`) loses one attempt to
  its CRC. Each failed attempt is in the trace.

hcomm.vtiming computes the same times vectorised over ranks; tests hold the two equal.
"""
from __future__ import annotations

import bisect
from collections import deque

from topologies.errors import HcclError
from topologies.model import transfer_ns

from .cost import as_cost
from .link_state import LinkFailure, LinkState
from .steps import Copy, Recv, Send, Stage


class _Rank:
    __slots__ = ("steps", "index", "clock", "pending", "step_end")

    def __init__(self, steps, clock):
        self.steps = steps
        self.index = 0
        self.clock = clock
        self.pending = 0
        self.step_end = clock


class _Transfer:
    __slots__ = ("src", "dst", "key", "send_op", "recv_op", "send_post", "recv_post", "egress", "ingress",
                 "route", "arrive", "index")

    def __init__(self, src, dst, key, index):
        self.src, self.dst, self.key, self.index = src, dst, key, index
        self.send_op = self.recv_op = self.send_post = self.recv_post = None
        self.egress = self.ingress = self.route = self.arrive = None


class _Inbox:
    """The reducing receives of one rank's step, reduced together once all have arrived."""
    __slots__ = ("expected", "arrived")

    def __init__(self, expected):
        self.expected, self.arrived = expected, []


def replay(schedules, entry_ns, cost, dtype: str = "float32", redop: str | None = "sum",
           events: list | None = None, op_name: str = "op", links=None, marks: list | None = None,
           corrupt: dict | None = None, first: dict | None = None):
    """Replay per-rank step lists; return every rank's exit clock (ns).

    Args:
        schedules: one list of steps (tuples of hcomm.steps ops) per rank.
        entry_ns: every rank's clock at entry.
        cost: the hcomm.cost.CostModel (or a Topology, taken as its cost model) pricing the steps.
        dtype, redop: what a reduction reduces (decides inline reduce on hardware presets).
        events: optional list to append Chrome-trace-like (rank, name, start_ns, end_ns, args).
        links: an hcomm.link_state.LinkState: transfers over links it has down are retransmitted (or
            fail: LinkFailure), over slowed links they take longer. None: every link as built.
        marks: optional list of one list per rank, to which each rank's clock is appended as it
            starts each of its steps.
        corrupt: {(src, dst, k): label} of transfers that fail their CRC once (needs `links`, the
            retransmission rule): the k-th transfer from src to dst, counted from `first[(src,
            dst)]` (the pair's transfers before this replay, default 0). An entry is removed when
            its transfer is transmitted, so a retried op does not lose that attempt again.
    """
    model = as_cost(cost)
    p = len(schedules)
    ranks = [_Rank(s, int(t)) for s, t in zip(schedules, entry_ns)]
    dm = model.device_model
    engine_free = [0] * p
    port_free = {}
    pair_free = {}              # (egress, ingress) -> the pair's last wire end, where ports outrun a pair
    queues = {}                 # port -> pending transfers, in issue order
    pending_sends, pending_recvs = {}, {}
    inboxes = [None] * p
    seq = [0]
    made = dict(first or {})    # (src, dst) -> transfers of the pair so far (their index)
    if corrupt and not isinstance(links, LinkState):
        raise HcclError("E_INTERNAL", "a corrupted transfer needs the link state's retransmission rule", op=op_name)

    def local(r, op, t):
        reducing = isinstance(op, Copy) and op.reduce_with is not None
        cost = dm.local_reduce_ns(op.nbytes, dtype, redop or "sum") if reducing else dm.copy_ns(op.nbytes)
        start = max(t, engine_free[r])
        end = engine_free[r] = start + cost
        if events is not None and cost:
            name = ("local reduce" if reducing else "copy") if isinstance(op, Copy) else f"stage-{op.direction}"
            events.append((r, name, start, end, {"bytes": op.nbytes}))
        return end

    def transfer_for(src, dst, order, sending):
        """The k-th send from src to dst pairs with the k-th receive at dst from src."""
        mine, theirs = (pending_sends, pending_recvs) if sending else (pending_recvs, pending_sends)
        waiting = theirs.get((src, dst))
        if waiting:
            return waiting.popleft()
        seq[0] += 1
        index = made.get((src, dst), 0)
        made[(src, dst)] = index + 1
        tr = _Transfer(src, dst, (order, src, dst, seq[0]), index)
        tr.route = model.route(src, dst)
        tr.egress, tr.ingress = ("out",) + tr.route.egress, ("in",) + tr.route.ingress
        mine.setdefault((src, dst), deque()).append(tr)
        return tr

    def enqueue(port, tr):
        q = queues.setdefault(port, [])
        bisect.insort(q, (tr.key, tr))
        return port

    def post(r):
        rk = ranks[r]
        while rk.index < len(rk.steps):
            step = rk.steps[rk.index]
            t = rk.clock
            if marks is not None:
                marks[r].append(t)
            end, pending = t, 0
            touched = []
            reducing = sum(1 for op in step if isinstance(op, Recv) and op.reduce_with is not None)
            inboxes[r] = _Inbox(reducing) if reducing else None
            for op in step:
                if isinstance(op, Send):
                    tr = transfer_for(r, op.peer, op.order, True)
                    tr.send_op, tr.send_post = op, t
                    touched.append(enqueue(tr.egress, tr))
                    pending += 1
                elif isinstance(op, Recv):
                    tr = transfer_for(op.peer, r, op.order, False)
                    tr.recv_op, tr.recv_post = op, t
                    touched.append(enqueue(tr.ingress, tr))
                    pending += 1
            for op in step:
                if isinstance(op, (Copy, Stage)):
                    end = max(end, local(r, op, t))
            if pending == 0:
                rk.clock = end
                rk.index += 1
                continue
            rk.pending, rk.step_end = pending, end
            serve(touched)
            return

    def head(port):
        q = queues.get(port)
        return q[0][1] if q else None

    def serve(ports):
        """Grant ports to transfers that head both their queues and whose two sides have posted."""
        work = list(ports)
        while work:
            tr = head(work.pop())
            if tr is None or tr.send_post is None or tr.recv_post is None:
                continue
            if head(tr.egress) is not tr or head(tr.ingress) is not tr:
                continue
            queues[tr.egress].pop(0)
            queues[tr.ingress].pop(0)
            arrived(tr)
            work.extend((tr.egress, tr.ingress))

    def arrived(tr):
        sop, rop = tr.send_op, tr.recv_op
        if sop.nbytes != rop.nbytes:
            raise HcclError("E_INTERNAL", f"schedule mismatch: rank {tr.src} sends {sop.nbytes} B to rank {tr.dst}, "
                            f"which expects {rop.nbytes} B", op=op_name)
        route = tr.route
        ready = max(tr.send_post, tr.recv_post) + model.notify_ns(tr.src, tr.dst) + dm.dispatch_ns
        reducing = rop.reduce_with is not None
        wire = transfer_ns(sop.nbytes, dm.wire_bandwidth(route.bandwidth, reducing, dtype, redop or "sum"))
        held = wire
        start = max(ready, port_free.get(tr.egress, 0), port_free.get(tr.ingress, 0))
        outrun = route.port_bandwidth != route.bandwidth
        if outrun:
            held = transfer_ns(sop.nbytes, dm.wire_bandwidth(route.port_bandwidth, reducing, dtype, redop or "sum"))
            start = max(start, pair_free.get((tr.egress, tr.ingress), 0))
        end = start + wire
        crc = corrupt.pop((tr.src, tr.dst, tr.index), None) if corrupt else None
        if links or crc is not None:
            lost = [] if events is not None else None
            try:
                end, _ = links.transmit(route.hops, start, wire, crc=crc, attempts=lost)
            except LinkFailure as failure:
                failure.src, failure.dst, failure.hops = tr.src, tr.dst, route.hops
                failure.step = ranks[tr.src].index
                failure.finished = tuple(r for r, rk in enumerate(ranks) if rk.index >= len(rk.steps))
                if events is not None:
                    lost_attempts(tr, sop, route, lost)
                    events.append((tr.src, f"send->{tr.dst} failed", start, failure.time_ns,
                                   {"bytes": sop.nbytes, "link": route.kind, "attempts": failure.attempts}))
                raise
            if lost:
                lost_attempts(tr, sop, route, lost)
        port_free[tr.egress] = port_free[tr.ingress] = end - (wire - held)    # a slowed or retried attempt holds them
        if outrun:
            pair_free[(tr.egress, tr.ingress)] = end
        tr.arrive = end + route.latency_ns
        if events is not None:
            events.append((tr.src, f"send->{tr.dst}", start, tr.arrive, {"bytes": sop.nbytes, "link": route.kind}))
            events.append((tr.dst, f"recv<-{tr.src}", start, tr.arrive, {"bytes": sop.nbytes, "link": route.kind}))
        if rop.reduce_with is None:
            finish(tr.dst, tr.arrive)
            finish(tr.src, tr.arrive + model.notify_ns(tr.dst, tr.src))
            return
        inbox = inboxes[tr.dst]
        inbox.arrived.append(tr)
        if len(inbox.arrived) == inbox.expected:
            reduce_inbox(tr.dst, inbox)

    def lost_attempts(tr, sop, route, lost):
        for t0, t1, why in lost:
            events.append((tr.src, f"send->{tr.dst} lost ({why.split(':')[0]})", t0, t1,
                           {"bytes": sop.nbytes, "link": route.kind, "why": why}))

    def reduce_inbox(dst, inbox):
        """One batch per sender, reduced in the order their last transfers were issued."""
        batches = {}
        for tr in inbox.arrived:
            batches.setdefault(tr.src, []).append(tr)
        order = sorted(batches.values(), key=lambda b: max(t.key for t in b))
        for batch in order:
            last = max(t.arrive for t in batch)
            cost = sum(dm.reduce_ns(t.recv_op.nbytes, dtype, redop) for t in batch)
            done = last
            if cost:
                rstart = max(last, engine_free[dst])
                done = engine_free[dst] = rstart + cost
                if events is not None:
                    events.append((dst, "reduce", rstart, done, {"bytes": sum(t.recv_op.nbytes for t in batch),
                                                                "from": batch[0].src}))
            for t in batch:
                finish(dst, done)
                finish(t.src, done + model.notify_ns(dst, t.src))

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

    stuck = [r for r, rk in enumerate(ranks) if rk.index < len(rk.steps)]
    if stuck:
        r = stuck[0]
        rk = ranks[r]
        peers = sorted({op.peer for op in rk.steps[rk.index] if isinstance(op, (Send, Recv))})
        raise HcclError("E_INTERNAL", f"schedule deadlock: ranks {stuck[:16]} never complete; rank {r} is stuck in "
                        f"step {rk.index} waiting on peers {peers}", op=op_name)
    return [rk.clock for rk in ranks]
