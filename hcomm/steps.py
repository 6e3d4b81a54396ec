"""The step vocabulary that schedules are written in and every engine executes.

A schedule is, for one rank, a list of steps; a step is a tuple of operations that run at once
(a ring step's send and receive, a mesh step's seven exchanges). Operations address slices of a
rank's named buffers ("input": the read-only user input; "output"; "scratch": the communicator's
buffer) by a range along the buffer's first axis, so the same schedule moves elements of a flat
array or rank blocks of a (ranks, block) view. The k-th Send from a to b pairs with the k-th Recv
at b from a. Zero-copy: a Recv reads the sender's slice in place, so a Send completes only when its
receiver has consumed it, and the sender must not write that slice before then.

Nothing here knows what a collective is.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Union


class Slice(NamedTuple):
    buf: str        # "input" | "output" | "scratch"
    start: int
    stop: int


class Send(NamedTuple):
    """Expose `src` to `peer`, which reads it in place. `order` is the transfer's place in its
    global step: ports serve equally ready transfers in that order (the algorithm's issue order)."""
    peer: int
    src: Slice
    nbytes: int
    order: int = 0


class Recv(NamedTuple):
    """Read `peer`'s matching slice into `dst`; with `reduce_with`, dst = peer_data (op) local[reduce_with]."""
    peer: int
    dst: Slice
    nbytes: int
    reduce_with: Optional[Slice] = None
    order: int = 0


class Copy(NamedTuple):
    """A local device copy; with `reduce_with`, a local reduce: dst = src (op) local[reduce_with]
    (HCCL's LocalReduce task, as the BIRS ReduceScatter's fixed-order tree uses it)."""
    src: Slice
    dst: Slice
    nbytes: int
    reduce_with: Optional[Slice] = None


class Stage(NamedTuple):
    """A modelled copy between user memory and the CCL buffer: costs device time, moves no data
    (the emulator's transport reads user memory in place)."""
    nbytes: int
    direction: str  # "in" | "out"


Op = Union[Send, Recv, Copy, Stage]
RankStep = tuple
"""One rank's step: the ops (Send, Recv, Copy, Stage) that run at once."""
