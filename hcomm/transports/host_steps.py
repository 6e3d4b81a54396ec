"""The step words of a rank's peers on its own host: what the hosted executor (hcomm.exec.hosted) waits
on instead of a record per slice.

Ranks of one host that keep an op's buffers in shared memory (hcomm.memory.segment_provider) can read
each other's slices where they lie, as HCCL's peers in a server read each other's CCL buffers. What
they still need from each other is when: a receiver must not read a slice before its sender has
reached the step that exposes it, and a sender must not write the slice again before its receivers
have read it. Two words per rank say it, in the rank's own ring segment (hcomm.transports.host_rings),
written only by that rank:

- POSTED: the op and step whose sends the rank exposes now (set as the step starts);
- TAKEN: the op and step whose receives the rank has finished.

A value is `(stamp << 32) | (step + 1)` with `stamp` the op's collective number plus one: both only
grow within a transport (one world communicator per transport), so a word left by an earlier op
never satisfies a wait of a later one. Each op starts by publishing where the rank's input, output
and scratch lie (`begin`: segment, offset, shape, dtype each), stamped with the op, so a peer maps
them once per run of ops with the same places (`peer_arrays`). A rank whose buffers are not all in
its segments publishes an empty record: its peers then take its slices as messages, as before.

Changing a word rings the doorbells of the peers that wait on it (`post`, `took`); they read the
words in their wait's readiness check (PeerEndpoint.wait_for), so the wake-up protocol of the rings
(bell read, check, sleep while the bell holds) covers the words too.

Ordering: a word is stored with release after the slices it speaks of were exposed or read, and
loaded with acquire (HostRings.publish, word_of): a receiver that sees POSTED reach a step sees
the sender's slices as they were written, and a sender that sees TAKEN reach it writes them again
only after its receivers' reads. On a TSO machine (amd64) this is what plain stores already did; on aarch64 it is
what keeps a reader from seeing the word before the data.
"""
from __future__ import annotations

import pickle

import numpy as np

from .host_rings import EXITED_W, POSTED_W, TAKEN_W

_PROTOCOL = pickle.HIGHEST_PROTOCOL


def step_value(stamp: int, step: int) -> int:
    """The word that says op `stamp` (collective number + 1) is at global step `step`."""
    return (stamp << 32) | (step + 1)


class HostSteps:
    """This rank's step words and its view of its host peers' (`ranks`, this one not among them),
    over its `rings` (HostRings) and `memory` (its SegmentProvider: `where`, `peer_view`)."""

    def __init__(self, rings, memory, ranks):
        self.rings, self.memory = rings, memory
        self.ranks = frozenset(ranks)
        self._mapped = {}                 # peer -> (its places record, its (input, output, scratch) here)
        self.read_in_place = 0            # peers' slices this rank read where they lie, by step words

    # ---- this rank's --------------------------------------------------------------------------------
    def begin(self, stamp: int, arrays) -> bool:
        """Publish where `arrays` (input, output, scratch; None where absent) lie for op `stamp`;
        whether they all lie in this rank's segments (else peers take its slices as messages)."""
        places = []
        for arr in arrays:
            if arr is None:
                places.append(None)
                continue
            at = self.memory.where(arr) if arr.nbytes else (None, 0)
            if at is None:
                self.rings.write_places(stamp, b"")
                return False
            places.append((at[0], at[1], arr.shape, arr.dtype.str))
        if not self.rings.write_places(stamp, pickle.dumps(tuple(places), protocol=_PROTOCOL)):
            self.rings.write_places(stamp, b"")
            return False
        return True

    def post(self, value: int, receivers) -> None:
        """This rank's sends of step `value` are exposed: tell `receivers`."""
        self.rings.publish(POSTED_W, value)
        for r in receivers:
            self.rings.ring(r)

    def took(self, value: int, senders) -> None:
        """This rank has read the slices `senders` (a sender per slice) exposed in step `value`:
        they may write them again."""
        self.rings.publish(TAKEN_W, value)
        self.read_in_place += len(senders)
        for s in dict.fromkeys(senders):
            self.rings.ring(s, ack=True)

    def leave(self) -> None:
        """This rank writes its words no more (its goodbye): peers waiting on them fail at once."""
        self.rings.publish(EXITED_W, 1)
        for r in self.ranks:
            self.rings.ring(r)

    # ---- the peers' ---------------------------------------------------------------------------------
    def exited(self, peer: int) -> bool:
        return bool(self.rings.word_of(peer, EXITED_W))

    def posted(self, peer: int) -> int:
        return self.rings.word_of(peer, POSTED_W)

    def taken(self, peer: int) -> int:
        return self.rings.word_of(peer, TAKEN_W)

    def places_stamp(self, peer: int) -> int:
        return self.rings.places_stamp(peer)

    def peer_arrays(self, peer: int):
        """`peer`'s (input, output, scratch) for the op whose places it last published, mapped here
        (kept while its places stay the same), or None if they are not in shared memory."""
        record = self.rings.places_of(peer)
        got = self._mapped.get(peer)
        if got is not None and got[0] == record:
            return got[1]
        if not record:
            arrays = None
        else:
            arrays = tuple(None if p is None else
                           np.empty(p[2], np.dtype(p[3])) if p[0] is None else
                           self.memory.peer_view(p[0], p[1], p[2], p[3]) for p in pickle.loads(record))
        self._mapped[peer] = (record, arrays)
        return arrays

    def close(self) -> None:
        self._mapped.clear()
