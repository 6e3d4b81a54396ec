"""A hccl_sim ProcessGroup's sends and receives: torch's send / recv / isend / irecv (with tags,
and a receive from any source), on which batch_isend_irecv runs.

A send copies its tensor and posts the copy (Communicator.isend), and its Work completes at once,
as gloo's buffered send does: the tensor may be reused, and no receiver's progress waits on the
sender's worker. A receive starts a Communicator.irecv; its Work completes when the worker has
taken the data (hccl_sim.torch.work), knows its source rank (`_source_rank()`, which torch's
recv from any source reads), and fails with E_PARA when the data that arrives is not the
tensor's size and dtype. Each transfer's record (comm.last_op's form) joins the group's records
once it is complete.

A rank's sends to itself pair with its receives from itself, per tag in issue order, as a local
copy: torch_npu runs batch_isend_irecv as one HcclBatchSendRecv, which copies a self pair locally
(torch runs the batch op by op for a Python group, so every self send and receive pairs so).
No transfer is priced for it and it has no record; a receive from itself that no send meets
fails E_TIMEOUT once the wait timeout has passed, as any receive does.

monitored_barrier is gloo's (torch's dist.monitored_barrier admits gloo groups alone; the group's
own method runs it): every other rank sends rank 0 a token and waits for its answer;
rank 0 waits for every token within the timeout, then answers each. A rank that does not arrive
in time is named by rank 0 (the first in rank order, or all of them with wait_all_ranks), and
the others fail naming rank 0, in gloo's words (torch's tests match them). Its tokens travel on
the top tag, 2**31 - 1, which user sends should leave to it.
"""
from __future__ import annotations

import time
from datetime import timedelta

import numpy as np

from topologies.errors import Cause, HcclError

from ..comm.communicator import MAX_TAG
from ..comm.p2p_calls import ANY_SOURCE
from .tensors import as_numpy
from .work import Deferred


class PointToPoint:
    """The point-to-point ops of ProcessGroupHcclSim (its collectives are on the group)."""

    def send(self, tensors, dstRank, tag=0):        # noqa: N803 - torch's names
        t = _one(tensors, "send")
        self._not_held("send")
        x = as_numpy(t).copy()
        if dstRank == self.comm.rank:
            return self._worker.submit(lambda: self._self_pairs.send(x, tag) or [t])
        at, sim = self._timed([], [t])

        def done(req):
            self._p2p_done(req)
            if sim is not None:
                sim.set(req.record.end)

        def job():
            self._worker.settle(Deferred(self.comm.isend(x, dstRank, tag, at=at), done, _failed(sim, at)))
            return [t]
        return self._worker.submit(job)

    def recv(self, tensors, srcRank, tag=0):        # noqa: N803 - torch's names
        return self._receive(tensors, srcRank, tag)

    def recv_anysource(self, tensors, tag=0):
        return self._receive(tensors, ANY_SOURCE, tag)

    def _receive(self, tensors, src, tag):
        t = _one(tensors, "recv")
        self._not_held("recv")
        out = as_numpy(t)
        at, sim = (None, None) if src == self.comm.rank else self._timed([t], [])

        def finish(req):
            if req.record is not None:
                self._p2p_done(req)
            if sim is not None:
                sim.set(req.record.end)
            data = req.data
            if data.size != out.size or data.dtype != out.dtype:
                raise HcclError("E_PARA", f"recv from rank {req.source} (tag {tag}): {data.size} elements of "
                                f"{data.dtype} arrived for a tensor of {out.size} elements of {out.dtype}",
                                rank=self.comm.rank, op="recv", cause=Cause.BAD_INPUT)
            out.reshape(-1)[...] = data.reshape(-1)
            return [t]
        if src == self.comm.rank:
            start = lambda: self._self_pairs.receive(tag, self.comm.rank, self.wait_timeout_s)  # noqa: E731
        else:
            start = lambda: self.comm.irecv(src, tag, at=at)  # noqa: E731
        work = self._worker.submit(lambda: Deferred(start(), finish), receive=True)
        if sim is not None:                  # a receive that failed ends where it was issued
            work.sim = sim
            work.get_future().add_done_callback(lambda _: sim.set(at))
        return work

    def _not_held(self, op):
        if self._held is not None:
            raise HcclError("E_NOT_SUPPORT", f"{op} between _group_start and _group_end: a group's sends and "
                            "receives are not held (use dist.batch_isend_irecv, one BatchSendRecv)",
                            rank=self.comm.rank, op=op, cause=Cause.BAD_INPUT)

    def _timed(self, outputs, inputs):
        """Under a timeline: when a transfer issued now starts, and its SimEnd; else (None, None)."""
        tl = self.world.timeline
        if tl is None:
            return None, None
        tl.stream_of(self)                   # the group is the timeline's rank's
        return tl.issue(outputs, inputs)

    def _p2p_done(self, req):
        self.records.append(req.record)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        comm = self.comm
        seconds = comm.wait_timeout if timeout is None else (
            timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout))

        def job():
            token = np.zeros(1, np.uint8)
            if comm.rank != 0:
                comm.isend(token, 0, MAX_TAG)
                if _within(comm, [comm.irecv(0, MAX_TAG)], seconds):
                    raise RuntimeError(f"Rank {comm.rank} successfully reached monitoredBarrier, but received errors "
                                       f"while waiting for send/recv from rank 0. Please check rank 0 logs for faulty "
                                       f"rank.")
                return []
            if seconds <= 0:                 # gloo's words when rank 0's own time is gone before it waits
                raise RuntimeError(f"Rank 0 timed out in monitoredBarrier after {round(seconds * 1000)} ms")
            reqs = [comm.irecv(q, MAX_TAG) for q in range(1, comm.size)]
            late = _within(comm, reqs, seconds)
            if late:
                ms = round(seconds * 1000)
                if wait_all_ranks:
                    raise RuntimeError(f"Ranks {', '.join(str(q) for q in late)} failed to pass monitoredBarrier in "
                                       f"{ms} ms")
                raise RuntimeError(f"Rank {late[0]} failed to pass monitoredBarrier in {ms} ms")
            for q in range(1, comm.size):
                comm.isend(token, q, MAX_TAG)
            return []
        self._worker.submit(job).wait()     # gloo's returns when passed (or raises)


class SelfPairs:
    """A rank's sends to itself not yet received, and its receives from itself not yet met, per
    tag (touched by the group's worker alone)."""

    def __init__(self):
        self._sent, self._waiting = {}, {}

    def send(self, x, tag) -> None:
        waiting = self._waiting.get(tag)
        while waiting and waiting[0].timed_out() is not None:
            waiting.pop(0)                # failed already (E_TIMEOUT): withdrawn, as a Communicator's receive is
        if waiting:
            waiting.pop(0).data = x
        else:
            self._sent.setdefault(tag, []).append(x)

    def receive(self, tag, rank, timeout_s) -> "SelfReceive":
        req = SelfReceive(rank, tag, timeout_s)
        sent = self._sent.get(tag)
        if sent:
            req.data = sent.pop(0)
        else:
            self._waiting.setdefault(tag, []).append(req)
        return req


class SelfReceive:
    """A receive from the rank itself, as the worker tests a Communicator Request."""
    __slots__ = ("source", "tag", "data", "record", "_deadline", "_timeout_s")

    def __init__(self, rank, tag, timeout_s):
        self.source, self.tag, self.data, self.record = rank, tag, None, None
        self._timeout_s = timeout_s
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def test(self) -> bool:
        return self.data is not None

    def timed_out(self):
        if self._deadline is None or time.monotonic() < self._deadline:
            return None
        return HcclError("E_TIMEOUT", f"recv from this rank itself (tag {self.tag}): no send to itself met it within "
                         f"{self._timeout_s:g} s", rank=self.source, op="recv", cause=Cause.TIMEOUT)


def _within(comm, reqs, seconds) -> list:
    """Wait for the receives up to `seconds`; the peers of those that did not complete (they are
    withdrawn, so a late token is never taken for a later barrier's)."""
    deadline = time.monotonic() + seconds
    delay = 0.0
    while not all(r.test() for r in reqs) and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(0.002, delay * 2 + 1e-4)
    late = [r for r in reqs if not r.done()]
    for r in late:
        r.cancel()
    return [r.peer for r in late]


def _failed(sim, at):
    """A failed send's end, under a timeline: where it was issued (its Work completed at once;
    the error is its Request's)."""
    return None if sim is None else (lambda exc: sim.set(at))


def _one(tensors, op):
    if len(tensors) != 1:
        raise HcclError("E_PARA", f"{op} takes one tensor, got {len(tensors)}", cause=Cause.BAD_INPUT)
    return tensors[0]
