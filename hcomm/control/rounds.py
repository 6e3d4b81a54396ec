"""A group's numbered control rounds: the sequence every round of its control plane takes a
number from (the rendezvous and a data plane's rounds alike), the deadline of each
(HCCL_EXEC_TIMEOUT), and the record of every wait for a stall watch (the Ray engine's).
"""
from __future__ import annotations

import contextlib
import time

_NO_WATCH = contextlib.nullcontext()      # stateless: one serves every wait


class GroupRounds:
    """`allgather(payload, what, op)`: every rank's payload of the group's next round, in rank
    order. `control` is the group's control plane (hcomm.control); `wait_timeout_s` bounds each
    round (0: no deadline); `watch`, if given, records each wait (`with watch.waiting(what)`).
    `what` is a string, or (op, seq) for a collective's round (the watch formats it when read)."""

    def __init__(self, control, wait_timeout_s: float, watch=None):
        self.control, self.wait_timeout_s, self.watch = control, wait_timeout_s, watch
        self.seq = 0

    def deadline(self):
        return None if not self.wait_timeout_s else time.monotonic() + self.wait_timeout_s

    def waiting(self, what):
        return _NO_WATCH if self.watch is None else self.watch.waiting(what)

    def allgather(self, payload: bytes, what, op: str | None) -> list:
        seq = self.seq
        self.seq += 1
        if self.watch is None:
            return self.control.allgather(seq, payload, self.deadline(), op)
        with self.watch.waiting(what):
            return self.control.allgather(seq, payload, self.deadline(), op)

    def allgather_records(self, payload: bytes, layout, what, op: str | None):
        """The next round as ControlPlane.allgather_records gives it: (columns, None) or (None, list)."""
        seq = self.seq
        self.seq += 1
        if self.watch is None:
            return self.control.allgather_records(seq, payload, layout, self.deadline(), op)
        with self.watch.waiting(what):
            return self.control.allgather_records(seq, payload, layout, self.deadline(), op)
