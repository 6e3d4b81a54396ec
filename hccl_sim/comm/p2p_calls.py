"""The Communicator's point-to-point calls: send, recv, HcclBatchSendRecv, and the nonblocking
isend / irecv (mpi4py's shape: a Request to test or wait on; a receive from ANY_SOURCE).

send and recv are HCCL's HcclSend / HcclRecv: the send returns once its receiver has taken the
data. isend and irecv are what a runtime above HCCL needs to issue transfers in any order
without a deadlock (torch's isend / irecv, batch_isend_irecv): an isend posts its array (which
must not be written until the Request completes; zero copy) and returns, an irecv returns at
once, and the transfers complete as the Requests are tested or waited on. A rank's receives on
one channel complete in the order they were issued (MPI's matching order); a receive from
ANY_SOURCE takes the first message that is there, the lowest source rank first. Every transfer
is priced as send and recv price theirs (hccl_sim.comm.p2p): the receive starts at the
receiver's clock when it was issued; a Request that completes moves the rank's clock to its end
(the host saw it complete no earlier), and becomes `comm.last_op`. A runtime that keeps a
timeline of its own (the torch backend's streams, hccl_sim.torch.timeline) issues a transfer
`at=` a simulated time instead: it starts then, and its end is its record's alone (the host's
clock stays where it is).

A Communicator is one rank's: its calls, tests and waits come from one thread at a time.
"""
from __future__ import annotations

import time

import numpy as np

from topologies.errors import Cause, HcclError

from hcomm.exec.p2p import ANY_SOURCE

from ..config.types import dtype_name
from . import group, p2p
from .record import OpRecord, note_p2p

P2P_TAG = "p2p"
_WAIT_SLICE_S = 0.002          # a polled wait's longest sleep between tests


class Request:
    """A nonblocking send's or receive's handle: `test()` (progress without waiting; True once
    done), `wait()` (until done, within the transport's deadline; a receive returns its array),
    `timed_out()` (its E_TIMEOUT once past that deadline, else None), `cancel()` (withdraw a
    receive still pending), `source` (the rank a receive took its data from), `record` (its
    OpRecord once done)."""
    __slots__ = ("comm", "kind", "peer", "tag", "start", "source", "data", "record", "_array", "_msg", "_deadline",
                 "_on_host")

    def __init__(self, comm, kind, peer, tag, start, array=None, msg=None, on_host=True):
        self.comm, self.kind, self.peer, self.tag, self.start = comm, kind, peer, tag, start
        self._on_host = on_host            # whether its completion moves the rank's host clock
        self.source = peer if kind == "isend" or peer != ANY_SOURCE else None
        self.data = self.record = None
        self._array, self._msg = array, msg
        self._deadline = comm._p2p.deadline()

    def done(self) -> bool:
        return self.record is not None

    def test(self) -> bool:
        if self.record is None:
            _progress_receives(self.comm)  # a test or wait of any Request moves the pending receives on
            if self.kind == "isend":
                endpoint = self.comm._p2p
                if endpoint.delivered(self._msg):
                    self._finish_send(endpoint.wait_delivered(self._msg, "isend", deadline=None))
        return self.record is not None

    def wait(self):
        delay = 0.0
        while not self.test():
            late = self.timed_out()
            if late is not None:
                raise late
            time.sleep(delay)
            delay = min(_WAIT_SLICE_S, delay * 2 + 1e-4)
        return self.data

    def timed_out(self):
        """The E_TIMEOUT of a Request past its deadline (HCCL_EXEC_TIMEOUT from its issue), else None."""
        if self.record is not None or self._deadline is None or time.monotonic() <= self._deadline:
            return None
        self.cancel()                                          # a receive: it will take nothing now
        return HcclError("E_TIMEOUT", f"{self.kind} {'to' if self.kind == 'isend' else 'from'} "
                         f"{'any rank' if self.peer == ANY_SOURCE else f'rank {self.peer}'} (tag {self.tag}) "
                         f"did not complete within HCCL_EXEC_TIMEOUT ({self.comm.wait_timeout} s)",
                         rank=self.comm.rank, op=self.kind, cause=Cause.TIMEOUT)

    def cancel(self) -> bool:
        """Withdraw a receive not yet matched: it takes nothing now (a message meant for it stays
        for the next receive on its channel); whether it was pending. A send, once posted, is
        its receiver's to take: nothing to withdraw (False)."""
        return self.comm._p2p.cancel(self)

    def _finish_send(self, reply):
        comm = self.comm
        end = p2p.sender_exit(comm, reply, "isend")
        x = self._array
        self.record = OpRecord("isend", "p2p", x.nbytes, x.size, dtype_name(x.dtype), self.start, end)
        self._msg = self._array = None
        _complete(comm, self.record, self._on_host)

    def _finish_receive(self, arrived):
        comm = self.comm
        data = arrived.copy()
        end = p2p.priced_receive(comm, arrived, data.nbytes, self.start, "irecv")
        self.source, self.data = arrived.source, data
        self.record = OpRecord("irecv", "p2p", data.nbytes, data.size, dtype_name(data.dtype), self.start, end)
        _complete(comm, self.record, self._on_host)


def _complete(comm, record, on_host):
    if on_host and record.end > comm.device.clock:
        comm.device.clock = record.end
    note_p2p(comm, record)


def _progress_receives(comm):
    """Take what is there for the pending receives, in issue order (hcomm.exec.p2p matches them:
    a receive whose channel has a message takes it; one from ANY_SOURCE, the lowest source that
    has one), and price each."""
    for req, arrived in comm._p2p.arrivals("irecv"):
        req._finish_receive(arrived)


class PointToPointOps:
    """The Communicator's point-to-point calls (its collectives are on the Communicator)."""

    def _peer(self, peer, opname, what, self_ok=False):
        if not isinstance(peer, (int, np.integer)) or isinstance(peer, bool) or not 0 <= peer < self.size:
            raise HcclError("E_PARA", f"{what} must be a rank in [0, {self.size}), got {peer!r}", rank=self.rank,
                            op=opname, cause=Cause.BAD_INPUT)
        if peer == self.rank and not self_ok:        # a group's may be (a local copy of its batch)
            raise HcclError("E_PARA", f"{what} is this rank itself", rank=self.rank, op=opname, cause=Cause.BAD_INPUT)
        return int(peer)

    def send(self, x, dst: int, tag: int = 0) -> None:
        """Send x to rank dst; returns once dst has received it (priced by the receiver, which
        replies with this rank's exit clock, or with the error CQE that ended the transfer)."""
        self._check_usable("send")
        x = self._array(x, "send")
        dst = self._peer(dst, "send", "dst", group.active())
        tag = self._tag(tag, "send")
        if group.active():
            return group.hold_p2p(self, "send", "send", dst, x, tag)
        dev = self.device
        start = dev.clock
        handle = self._p2p.post(dst, (P2P_TAG, tag), x, meta=start)
        reply = self._p2p.wait_delivered(handle, "send")
        self._p2p_sent[dst] = self._p2p_sent.get(dst, 0) + 1
        dev.clock = p2p.sender_exit(self, reply, "send")
        note_p2p(self, OpRecord("send", "p2p", x.nbytes, x.size, dtype_name(x.dtype), start, dev.clock))

    def recv(self, src: int, tag: int = 0) -> np.ndarray:
        """The next array rank src sends this rank (on `tag`). Under a fault plan the transfer is
        retransmitted over down links, slowed over slowed ones, loses an attempt when a corrupt
        entry names it, and runs over a backup NIC the communicator switched to; past the
        retransmission budget both ends get E_REMOTE (HCCL has no op retry for send/recv)."""
        self._check_usable("recv")
        src = self._peer(src, "recv", "src", group.active())
        tag = self._tag(tag, "recv")
        if group.active():
            return group.hold_p2p(self, "recv", "recv", src, None, tag)
        if self._p2p.expecting(src, (P2P_TAG, tag)):
            return self.irecv(src, tag).wait()      # receives issued earlier on the channel come first
        start = self.device.clock
        arrived = self._p2p.take(src, (P2P_TAG, tag), "recv")
        data = arrived.copy()
        self.device.clock = end = p2p.priced_receive(self, arrived, data.nbytes, start, "recv")
        note_p2p(self, OpRecord("recv", "p2p", data.nbytes, data.size, dtype_name(data.dtype), start, end))
        return data

    def isend(self, x, dst: int, tag: int = 0, at: int | None = None) -> Request:
        """Post x to rank dst and return a Request at once; x must not be written until the
        Request completes (its test() or wait()). `at`: the simulated ns it is issued at (default
        the host clock, which its completion then moves)."""
        self._check_usable("isend")
        if group.active():
            group.refuse(self, "isend", "a group holds its sends already: use send inside comm.group()")
        x = np.ascontiguousarray(self._array(x, "isend"))
        dst = self._peer(dst, "isend", "dst")
        tag = self._tag(tag, "isend")
        start = self._issue_time(at, "isend")
        handle = self._p2p.post(dst, (P2P_TAG, tag), x, meta=start)
        self._p2p_sent[dst] = self._p2p_sent.get(dst, 0) + 1
        return Request(self, "isend", dst, tag, start, x, handle, on_host=at is None)

    def irecv(self, src: int = ANY_SOURCE, tag: int = 0, at: int | None = None) -> Request:
        """A Request for the next array from rank src (ANY_SOURCE: from whichever rank's is there
        first) on `tag`; its wait() returns the array and its `source` the sender. `at`: as isend's."""
        self._check_usable("irecv")
        if group.active():
            group.refuse(self, "irecv", "a group holds its receives already: use recv inside comm.group()")
        if src != ANY_SOURCE:
            src = self._peer(src, "irecv", "src")
        req = Request(self, "irecv", src, self._tag(tag, "irecv"), self._issue_time(at, "irecv"), on_host=at is None)
        self._p2p.expect(src, (P2P_TAG, req.tag), req)
        return req

    def _issue_time(self, at, opname) -> int:
        if at is None:
            return self.device.clock
        if not isinstance(at, (int, np.integer)) or isinstance(at, bool) or at < 0:
            raise HcclError("E_PARA", f"at must be a simulated time in ns (an int >= 0), got {at!r}", rank=self.rank,
                            op=opname, cause=Cause.BAD_INPUT)
        return int(at)

    def batch_send_recv(self, items) -> list:
        """HcclBatchSendRecv: every ("send", peer, array) and ("recv", peer, array or (shape,
        dtype)) item as one op, in HCCL's pairwise order; returns the received arrays in item
        order. Each pair of ranks' sends and receives must match one to one (hccl_sim.comm.p2p)."""
        if group.active():
            group.refuse(self, "batch_send_recv", "HCCL does not allow BatchSendRecv in a group (the group's sends "
                         "and receives are one already)")
        return p2p.batch_send_recv(self, items)
