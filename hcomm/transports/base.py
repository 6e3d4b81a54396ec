"""The Transport base every hcomm transport subclasses, and the pieces they share.

A transport moves slices of ranks' registered buffers between ranks, gloo's UnboundBuffer shape:
the sender posts a slice and gets a handle, the receiver takes the next message on (src, dst, tag),
reads or reduces from `message.data`, and calls `message.consumed(reply)`; the sender's
`wait_consumed(handle)` returns that reply, and only then may it overwrite the slice (zero-copy:
HCCL's notify record/wait). Every wait takes a deadline (`transport.deadline()`, from
HCCL_EXEC_TIMEOUT) and is woken by `abort`, so a failure becomes an HcclError instead of a hang.

Shared here: the wording of every wait failure (so every transport reports a timeout, an exited
peer or a lost peer the same way), the abort state and the named-buffer registry. The half of a
transport that ranks sharing no memory all need is `peer.PeerEndpoint`.
"""
from __future__ import annotations

import abc
import time
from typing import Any, Hashable, Optional

import numpy as np

from topologies.errors import Cause, HcclError

POLL_S = 0.05      # longest sleep of a waiter between checks; wake-ups on progress are immediate
PROBE_AFTER_S = 0.5  # a wait this long starts asking (where a transport must ask) whether its peer lives
PROBE_EVERY_S = 0.5


# ---- the protocol ---------------------------------------------------------------------------------

class Message(abc.ABC):
    """What `take` returns: `data` (a numpy array to read or reduce from; do not keep it past
    `consumed`), the sender's `meta`, and `consumed(reply)`, which completes the sender's handle."""
    __slots__ = ("src", "dst", "tag", "data", "meta")

    def __init__(self, src: int, dst: int, tag, data, meta):
        self.src, self.dst, self.tag, self.data, self.meta = src, dst, tag, data, meta

    @abc.abstractmethod
    def consumed(self, reply=None) -> None:
        """Tell the sender its slice may be reused; `reply` reaches its wait_consumed."""


class Transport(abc.ABC):
    """Tagged, deadline-bounded, zero-copy (where memory allows) channels among `size` ranks.

    Every transport subclasses this; every member a caller may use is declared here (c10d's
    rule: an optional member has its default here, so no caller probes a transport). Ranks are
    ints in [0, size); a tag is any hashable value the transport can carry (for the transports
    between processes: str, int, float, bool, None, or tuples of these). An endpoint of a
    transport between processes serves one rank; the in-process one serves all.

    Required: the abstract methods. Optional, with their defaults: `abort_scope` (one
    communicator's abort; default: the whole transport's), `watch_peer` / `unwatch_peer` / `lost`
    (peers that can be lost while their process runs elsewhere; default: none can), `world_rank`
    (a sub-communicator's view renumbers; default: the rank itself), `host_steps` with
    `share_host` and `wait_for` (peers on this host read in place; default: none do), `plane`
    (the name a data plane over this transport goes by)."""

    size: int
    timeout_s: Optional[float]
    plane: str = "peer"
    """The name of the per-rank data plane over this transport (comm.data_plane, the engine
    registry's names): "threads", "socket", "object", "p2p"."""
    host_steps = None
    """The step words of this rank's peers on its host (hcomm.transports.host_steps), where the
    transport reaches them through shared memory (`share_host`); None elsewhere."""

    # ---- required --------------------------------------------------------------------------------
    @abc.abstractmethod
    def register(self, rank: int, name: str, array: np.ndarray) -> None:
        """Make `array` addressable as buffer `name` of `rank` (replaces an earlier one)."""

    @abc.abstractmethod
    def deregister(self, rank: int, name: str) -> None:
        """Forget buffer `name` of `rank`."""

    @abc.abstractmethod
    def region(self, rank: int, name: str) -> np.ndarray:
        """The array registered as `name` of `rank`; E_PTR when there is none."""

    @abc.abstractmethod
    def post(self, src: int, dst: int, tag: Hashable, region: str, start: int, stop: int, meta: Any = None):
        """Send region[start:stop] (first axis) of `src`'s buffer `region` to `dst`; returns a
        handle for `wait_consumed`. Does not wait; `src` must not write the slice until then."""

    @abc.abstractmethod
    def post_view(self, src: int, dst: int, tag: Hashable, view: np.ndarray, meta: Any = None):
        """Like `post`, for an array that is not registered."""

    @abc.abstractmethod
    def take(self, src: int, dst: int, tag: Hashable, deadline: Optional[float] = None,
             op: Optional[str] = None) -> Message:
        """Wait for the next message from `src` to `dst` on `tag` (messages on one (src, dst, tag)
        arrive in posting order). E_TIMEOUT past `deadline` (time.monotonic() seconds), E_REMOTE
        when `src` is lost, E_PARA when `src` has exited without sending it, the abort's code
        once aborted."""

    @abc.abstractmethod
    def wait_consumed(self, handle, deadline: Optional[float] = None, op: Optional[str] = None):
        """Wait until the receiver has called `consumed(reply)` on the message; returns the reply.
        Fails like `take`."""

    @abc.abstractmethod
    def ready(self, src: int, dst: int, tag: Hashable) -> bool:
        """Whether `take(src, dst, tag)` would return at once (a message is there). Never waits;
        a transport whose ranks drive their own progress makes one step of it."""

    @abc.abstractmethod
    def is_consumed(self, handle) -> bool:
        """Whether `wait_consumed(handle)` would return at once. Never waits, as `ready`."""

    @abc.abstractmethod
    def deadline(self) -> Optional[float]:
        """The deadline of a wait that starts now (None when there is no timeout)."""

    @abc.abstractmethod
    def abort(self, code: str, reason: str) -> None:
        """Fail every wait on this transport, now and later, with HcclError(code, 'aborted: reason')."""

    @abc.abstractmethod
    def mark_exited(self, rank: int) -> None:
        """`rank` will post and consume nothing more: waits on it fail at once."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release threads, sockets and references; waits in progress are aborted."""

    # ---- optional, with defaults -------------------------------------------------------------------
    def abort_scope(self, scope: str, code: str, reason: str, after=None) -> None:
        """One communicator's abort (`scope`: its tags, see `scope_of`): fail the waits on that
        scope's tags, here and at every peer, but not those of its control rounds before `after`
        (AbortState). Default: a transport that serves one communicator aborts whole."""
        self.abort(code, reason)

    def watch_peer(self, peer: int) -> None:
        """Until `unwatch_peer(peer)`: every wait fails with E_REMOTE naming `peer` once it is
        lost, whichever peer it waits for. Default: no peer of this transport can be lost apart
        from its own exit (threads of one process), so there is nothing to watch."""

    def unwatch_peer(self, peer: int) -> None:
        """Undo `watch_peer(peer)`."""

    def lost(self, peer: int) -> Optional[str]:
        """Why `peer` is lost, or None while it may live."""
        return None

    def world_rank(self, rank: int) -> int:
        """The job's rank that this transport's `rank` is (a sub-communicator's view renumbers)."""
        return rank

    def share_host(self, memory, ranks) -> None:
        """`ranks` (this rank among them) share this rank's host: reach them through `memory`'s
        segments (their slices read in place, step words in `host_steps`)."""
        raise HcclError("E_NOT_SUPPORT", f"{type(self).__name__} does not reach peers through shared memory")

    def wait_for(self, peer: int, ready, deadline: Optional[float] = None, op: Optional[str] = None,
                 for_acks: bool = False, tag=None) -> None:
        """Wait until `ready()` holds, woken by `peer`'s step words (`host_steps`) and by this
        transport's own traffic; fails as `take` from `peer` (for_acks: as `wait_consumed`)."""
        raise HcclError("E_NOT_SUPPORT", f"{type(self).__name__} has no host peers to wait for")


# ---- failure wording, one place for every transport -------------------------------------------------

def _op_suffix(op):
    return f" ({op})" if op else ""


def waiting_for_data(src, op=None) -> str:
    return f"data from rank {src}" + _op_suffix(op)


def waiting_for_consumer(dst, op=None) -> str:
    return f"rank {dst} to take its data" + _op_suffix(op)


def take_timeout(src, dst, timeout_s, op) -> HcclError:
    return HcclError("E_TIMEOUT", f"no data from rank {src} within {timeout_s or 0:g} s (HCCL_EXEC_TIMEOUT)",
                     rank=dst, op=op, cause=Cause.TIMEOUT, peers=(src,))


def consume_timeout(src, dst, timeout_s, op) -> HcclError:
    return HcclError("E_TIMEOUT", f"rank {dst} did not consume the data sent to it within {timeout_s or 0:g} s "
                     "(HCCL_EXEC_TIMEOUT)", rank=src, op=op, cause=Cause.TIMEOUT, peers=(dst,))


def take_exited(src, dst, tag, op) -> HcclError:
    return HcclError("E_PARA", f"rank {src} returned without sending what this rank waits for (tag {tag!r})",
                     rank=dst, op=op, cause=Cause.PEER_RETURNED, peers=(src,), detail={"missed": "send"})


def consume_exited(src, dst, tag, op) -> HcclError:
    return HcclError("E_PARA", f"rank {dst} returned without receiving what this rank sent (tag {tag!r})",
                     rank=src, op=op, cause=Cause.PEER_RETURNED, peers=(dst,), detail={"missed": "receive"})


def peer_lost(peer, me, reason, op) -> HcclError:
    return HcclError("E_REMOTE", f"lost rank {peer}: {reason}", rank=me, op=op, cause=Cause.PEER_LOST, peers=(peer,))


def connect_timeout(peer, me, timeout_s, reason) -> HcclError:
    return HcclError("E_TIMEOUT", f"could not connect to rank {peer} within {timeout_s:g} s "
                     f"(HCCL_CONNECT_TIMEOUT): {reason}", rank=me, cause=Cause.TIMEOUT, peers=(peer,))


def remaining(deadline) -> Optional[float]:
    return None if deadline is None else deadline - time.monotonic()


def check_rank(rank, size, what, me=None, op=None) -> int:
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < size:
        raise HcclError("E_PARA", f"{what} must be a rank in [0, {size}), got {rank!r}", rank=me, op=op)
    return int(rank)


SCOPED = "sub"
"""First element of a scoped tag, (SCOPED, scope, tag): a sub-communicator's traffic over its
parent's transport (hcomm.transports.scoped). Every other tag belongs to the scope WORLD."""
WORLD = ""
ABORT_NOTICE = "abort-notice"
"""Tag of the frame `abort_scope` sends every peer: (ABORT_NOTICE, scope); its meta is (code, reason, after)."""


def scope_of(tag) -> str:
    """The communicator scope a tag belongs to."""
    if type(tag) is tuple and len(tag) == 3 and tag[0] == SCOPED:
        return tag[1]
    return WORLD


def control_round(tag):
    """The control round a tag belongs to (hcomm.control.transport's ("ctl", round, step)), or None."""
    if type(tag) is tuple and len(tag) == 3 and tag[0] == SCOPED:
        tag = tag[2]
    if type(tag) is tuple and len(tag) == 3 and tag[0] == "ctl":
        return tag[1]
    return None


class AbortState:
    """The abort every transport carries: first (code, reason) wins; `check` raises it. A scoped
    abort (one communicator's, `set_scope`) fails only the waits on that scope's tags, and, when
    the aborting rank says how many of the scope's control rounds it had finished (`after`), not
    the waits of those rounds: every rank finishes a round the aborter finished (as ranks that
    are threads do), and the abort meets the next."""

    def __init__(self):
        self._abort = None
        self._scopes = {}

    def set(self, code: str, reason: str) -> None:
        if self._abort is None:
            self._abort = (code, reason)

    def set_scope(self, scope: str, code: str, reason: str, after=None) -> None:
        self._scopes.setdefault(scope, (code, reason, after))

    @property
    def aborted(self):
        return self._abort

    def check(self, rank, op, tag=None) -> None:
        got = self._abort
        if got is None and self._scopes and tag is not None:      # a wait on a tag: its scope's abort too
            got = self._scopes.get(scope_of(tag))
            if got is not None and got[2] is not None:
                ctl = control_round(tag)
                if ctl is not None and ctl < got[2]:
                    return                      # a round the aborting rank had finished
        if got is not None:
            code, reason = got[:2]
            raise HcclError(code, f"aborted: {reason}", rank=rank, op=op, cause=Cause.ABORTED)


class Registry:
    """Named buffers of the ranks an endpoint serves."""

    def __init__(self):
        self._buffers = {}

    def register(self, rank, name, array) -> None:
        self._buffers[(rank, name)] = array

    def deregister(self, rank, name) -> None:
        self._buffers.pop((rank, name), None)

    def region(self, rank, name):
        try:
            return self._buffers[(rank, name)]
        except KeyError:
            raise HcclError("E_PTR", f"buffer {name!r} is not registered", rank=rank) from None
