"""One rank's point-to-point transfers over a Transport: the byte moves of HcclSend, HcclRecv,
HcclBatchSendRecv and the nonblocking isend / irecv, and the matching of pending receives.

This module moves; the collective layer prices. A send posts the sender's array where it lies
(zero copy: it must not be written until the receiver's reply is back) with a meta the layer
above chose (the sender's clock); a receive takes the next message on its channel and copies
its data out, into a buffer given or an array of its own. The receiver's layer prices the
transfer from the meta and `Arrived.reply` carries the sender its answer (its exit clock, or the
error that ended the transfer), which the sender's wait returns. Nothing here knows a price, an
op or a fault plan.

Receives posted ahead (`expect`) wait in issue order: `arrivals()` gives each the first message
there for it, a receive on one (source, channel) taking messages in the order they were sent, one
from ANY_SOURCE the first there, lowest source first. A receive withdrawn (`cancel`) takes nothing.
"""
from __future__ import annotations

from typing import Hashable

import numpy as np

ANY_SOURCE = -1


class Arrived:
    """A message taken for a receive: `source`, the sender's `meta`; `copy()` / `copy_into(out)`
    move the data; `reply(value)` answers the sender (after which the data may no longer be read:
    the sender may reuse its buffer)."""
    __slots__ = ("source", "meta", "_msg")

    def __init__(self, source: int, msg):
        self.source, self.meta, self._msg = source, msg.meta, msg

    def copy(self) -> np.ndarray:
        """The data, as an array of this rank's own."""
        return np.array(self._msg.data, copy=True)

    def copy_into(self, out: np.ndarray) -> np.ndarray:
        """The data copied into `out` (as many elements, any shape); returns `out`."""
        np.copyto(out.reshape(-1), np.asarray(self._msg.data).reshape(-1))
        return out

    def reply(self, value) -> None:
        """Complete the sender's transfer with `value` (plain values: every transport carries them)."""
        self._msg.consumed(reply=value)


def copy_local(src: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """A transfer of a rank to itself (a batch's own pair): `src` copied into `out`, or into a new
    array when `out` is None; returns the array written."""
    if out is None:
        return src.copy()
    np.copyto(out.reshape(-1), src.reshape(-1))
    return out


class Endpoint:
    """Rank `rank`'s sends and receives on `transport` (of `size` ranks), on hashable channels."""

    def __init__(self, transport, rank: int, size: int):
        self.transport, self.rank, self.size = transport, rank, size
        self._expected = []              # (source or ANY_SOURCE, channel, token) of receives posted ahead, in order

    @property
    def timeout_s(self):
        """How long a wait may last (the transport's: HCCL_EXEC_TIMEOUT); None: no limit."""
        return self.transport.timeout_s

    def deadline(self):
        """The deadline of a wait that starts now (None: none)."""
        return self.transport.deadline()

    # sending ------------------------------------------------------------------------------------------
    def post(self, dst: int, channel: Hashable, x: np.ndarray, meta):
        """Post `x` to `dst` (in place when contiguous); the handle for `delivered` / `wait_delivered`."""
        return self.transport.post_view(self.rank, dst, channel, np.ascontiguousarray(x), meta=meta)

    def delivered(self, handle) -> bool:
        """Whether the receiver has answered (never waits)."""
        return self.transport.is_consumed(handle)

    def wait_delivered(self, handle, op: str, deadline=...):
        """The receiver's answer to a post (within `deadline`, default one from now; None: no wait
        limit, for a handle known delivered)."""
        return self.transport.wait_consumed(handle, self.deadline() if deadline is ... else deadline, op)

    # receiving ----------------------------------------------------------------------------------------
    def take(self, src: int, channel: Hashable, op: str) -> Arrived:
        """The next message from `src` on `channel` (waits, within the transport's deadline)."""
        return Arrived(src, self.transport.take(src, self.rank, channel, self.deadline(), op))

    def expect(self, src: int, channel: Hashable, token) -> None:
        """Post a receive ahead, from `src` (or ANY_SOURCE) on `channel`; `token` names it in
        `arrivals` and `cancel`."""
        self._expected.append((src, channel, token))

    def expecting(self, src: int, channel: Hashable) -> bool:
        """Whether a receive posted ahead on `channel` could take `src`'s next message (so a new
        one on it must come after it)."""
        return any(c == channel and s in (src, ANY_SOURCE) for s, c, _ in self._expected)

    def cancel(self, token) -> bool:
        """Withdraw a receive posted ahead (it takes nothing now); whether it was still pending."""
        for entry in self._expected:
            if entry[2] is token:
                self._expected.remove(entry)
                return True
        return False

    def arrivals(self, op: str):
        """(token, Arrived) for each receive posted ahead whose message is there, in issue order;
        each is withdrawn as it is given. Lazy: a consumer that stops early leaves the rest
        pending (and their messages where they are)."""
        me, transport = self.rank, self.transport
        # (source, channel) pairs an earlier receive still waits on: a message that arrives on one
        # while this walk goes on is that receive's, never a later one's
        waiting = set()
        for entry in list(self._expected):
            src, channel, token = entry
            sources = [s for s in (range(self.size) if src == ANY_SOURCE else (src,)) if s != me]
            for s in sources:
                if (s, channel) not in waiting and transport.ready(s, me, channel):
                    msg = transport.take(s, me, channel, transport.deadline(), op)
                    self._expected.remove(entry)
                    yield token, Arrived(s, msg)
                    break
            else:
                waiting.update((s, channel) for s in sources)
