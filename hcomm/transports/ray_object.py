"""Ray object-store transport: payloads between rank actors through Ray's object store.

Each rank lives in a Ray actor that mixes in `RayMailbox` and holds its endpoint as
`self.hcomm_transport`. A send puts the slice in the object store (`ray.put`: one copy into the
sender's node's store; slices up to INLINE_BYTES ride inside the call instead) and hands the reference, wrapped in a list so that Ray passes the reference
and not the value, to the receiver's actor by a method call (`hcomm_deliver`); the receiver fetches
it when it takes the message (Ray pulls it across nodes; on one node the array is a read-only view
of shared memory, no copy), and its `consumed(reply)` calls `hcomm_ack` on the sender's actor,
which completes the sender's handle and drops the reference.

The actor must be threaded (`max_concurrency` >= 2): its main method blocks in the executor while
peers' deliveries and acknowledgements run on its other threads. Threaded actors run calls in any
order, so deliveries carry a per-(sender, receiver) sequence number and are queued in order; a
rank's goodbye (`hcomm_bye`) carries how many messages and acknowledgements it sent, so it never
overtakes them. A dead
peer is found by pinging it while a wait on it lasts (Ray tells of a dead actor only when asked):
E_REMOTE naming the rank. Tags and meta travel pickled with the call (small control data only).
"""
from __future__ import annotations

import time

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from topologies.errors import HcclError

from .base import peer_lost, remaining, take_timeout
from .peer import PeerEndpoint, RemoteMessage

_FETCH_SLICE_S = 0.2     # a fetch re-checks abort and the deadline this often
INLINE_BYTES = 64 << 10  # slices up to this size travel inside the delivering call, not as object refs


class RayMailbox:
    """The methods by which peers reach a rank's endpoint; mix into the rank's actor class.

    Every call names the endpoint's epoch: an actor that opens a new endpoint for each run drops a
    peer's late call of an earlier run (a goodbye, an acknowledgement, a delivery to a rank that
    had given up), which would otherwise count against the new endpoint's messages."""

    def _endpoint(self, epoch):
        tr = getattr(self, "hcomm_transport", None)
        return tr if tr is not None and tr.epoch == epoch else None

    def hcomm_deliver(self, epoch, src, seq, tag, refs, meta, msg_id):
        tr = self._endpoint(epoch)
        if tr is not None:
            tr.delivered(src, seq, tag, refs[0], meta, msg_id)

    def hcomm_ack(self, epoch, msg_id, reply):
        tr = self._endpoint(epoch)
        if tr is not None:
            tr.acknowledged(msg_id, reply)

    def hcomm_bye(self, epoch, src, sent, acked):
        tr = self._endpoint(epoch)
        if tr is not None:
            tr.said_bye(src, sent, acked)

    def hcomm_ping(self):
        return True


class _RayMessage(RemoteMessage):
    __slots__ = ("ref",)

    def consumed(self, reply=None) -> None:
        self.ref = None
        super().consumed(reply)


class RayObjectTransport(PeerEndpoint):
    """One rank's endpoint, living in that rank's actor; `start(actors)` joins it to the others."""

    plane = "object"

    def __init__(self, rank: int, size: int, timeout_s: float | None = None, epoch: int = 0):
        super().__init__(rank, size, timeout_s)
        self.epoch = epoch                  # every rank's endpoint of one run has the same (RayMailbox)
        self._actors = None
        self._sent = [0] * self.size        # messages sent to each rank (their sequence numbers)
        self._next = [0] * self.size        # the sequence number expected next from each rank
        self._held = {}                     # (src, seq) -> message that overtook an earlier one
        self._bye_after = {}                # src -> (messages, acks) it sent before its goodbye
        self._acks_to = [0] * self.size     # acknowledgements sent to each rank
        self._pings = {}                    # peer -> ping in flight

    def start(self, actors) -> None:
        """`actors`: the actor handle of every rank (a sequence or a mapping rank -> handle)."""
        try:
            handles = [actors[r] for r in range(self.size)]
        except (KeyError, IndexError, TypeError) as exc:
            raise HcclError("E_PARA", f"start() needs the actor of every one of {self.size} ranks: "
                            f"{type(exc).__name__}: {exc}", rank=self.rank) from None
        self._actors = handles

    def _actor(self, rank):
        if self._actors is None:
            raise HcclError("E_INTERNAL", "start(actors) was not called: no actor for any peer", rank=self.rank)
        return self._actors[rank]

    # sending --------------------------------------------------------------------------------------
    def _send_data(self, handle, view, meta):
        actor = self._actor(handle.dst)
        # a ray.put costs more than a call (~2 ms against ~0.5 ms here): small slices ride in the call
        ref = view if view.nbytes <= INLINE_BYTES else ray.put(view)
        with self.cond:
            seq = self._sent[handle.dst]
            self._sent[handle.dst] = seq + 1
            # submitted under the lock: a goodbye's count then covers every delivery submitted before it
            call = actor.hcomm_deliver.remote(self.epoch, self.rank, seq, handle.tag, [ref], meta, handle.id)
        handle.keep = (ref, call)           # the object lives (owned by this rank) until the ack

    def _send_ack(self, src, msg_id, reply):
        with self.cond:
            self._acks_to[src] += 1
            self._actor(src).hcomm_ack.remote(self.epoch, msg_id, reply)

    def _announce_exit(self):
        if self._actors is None:
            return
        with self.cond:
            for peer in range(self.size):
                if peer != self.rank:
                    self._actors[peer].hcomm_bye.remote(self.epoch, self.rank, self._sent[peer], self._acks_to[peer])

    # receiving -------------------------------------------------------------------------------------
    def delivered(self, src, seq, tag, ref, meta, msg_id):
        with self.cond:
            self._held[(src, seq)] = (tag, ref, meta, msg_id)
            while (src, self._next[src]) in self._held:
                tag, ref, meta, msg_id = self._held.pop((src, self._next[src]))
                msg = _RayMessage(self, src, tag, None, meta, msg_id)
                msg.ref = ref
                self.enqueue_locked(msg)
                self._next[src] += 1
            self._check_bye(src)

    def said_bye(self, src, sent, acked):
        with self.cond:
            self._bye_after[src] = (sent, acked)
            self._check_bye(src)

    def acknowledged(self, msg_id, reply):
        super().acknowledged(msg_id, reply)
        with self.cond:
            for src in list(self._bye_after):
                self._check_bye(src)

    def _check_bye(self, src):
        """A goodbye counts once everything sent before it has arrived (calls run in any order)."""
        if src in self._bye_after:
            sent, acked = self._bye_after[src]
            if self._next[src] >= sent:
                self._no_more_data.add(src)
            if self._acks_from[src] >= acked:
                self._no_more_acks.add(src)
            self.cond.notify_all()

    def take(self, src, dst, tag, deadline=None, op=None):
        msg = super().take(src, dst, tag, deadline, op)
        ref = msg.ref
        if isinstance(ref, np.ndarray):
            msg.data = ref
            return msg
        while True:                  # fetch (from another node, maybe) within the same deadline
            self._abort.check(dst, op)
            left = remaining(deadline)
            if left is not None and left <= 0:
                raise take_timeout(src, dst, self.timeout_s, op)
            try:
                msg.data = ray.get(ref, timeout=_FETCH_SLICE_S if left is None else min(_FETCH_SLICE_S, left))
                break
            except GetTimeoutError:
                continue
            except RayError as exc:
                raise peer_lost(src, dst, f"its data could not be fetched ({type(exc).__name__})", op) from None
        return msg

    def _probe(self, peer):
        ping = self._pings.get(peer)
        if ping is None:
            self._pings[peer] = self._actor(peer).hcomm_ping.remote()
            return None
        ready, _ = ray.wait([ping], timeout=0)
        if not ready:
            return None              # busy or slow is not dead: the deadline covers that
        del self._pings[peer]
        try:
            ray.get(ping, timeout=0)
        except RayActorError as exc:
            return f"its actor died ({type(exc).__name__})"
        except RayError as exc:
            return f"it does not answer ({type(exc).__name__})"
        return None

    def close(self) -> None:
        if self._closed:
            return
        self._announce_exit()
        self.abort("E_INTERNAL", f"rank {self.rank}'s Ray transport was closed")
        with self.cond:
            self._closed = True
            self._pings.clear()
            for handle in self._pending.values():
                handle.keep = None
            self._inbox.clear()
            self._held.clear()
