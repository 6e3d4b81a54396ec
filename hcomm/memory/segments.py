"""Shared-memory segments that hold ranks' registered buffers, visible to every process on a host.

A segment belongs to the rank that created it (it grows by replacement and is unlinked when the
rank closes); peers attach by name and read or reduce from it in place. Segments of one session
share a name prefix, so whatever a killed process left in /dev/shm is removed by `cleanup`.
Python's resource tracker is kept out (segments are `shared_file.Mapping`s, not
`multiprocessing.shared_memory`): it would unlink a segment when any process that merely attached
it exits, and where ranks share one parent's tracker (torch.multiprocessing.spawn), one rank's
unregister of a name another rank still had registered makes the tracker print a KeyError.
"""
from __future__ import annotations

import glob
import os
import socket
import uuid
import weakref

import numpy as np

from .shared_file import Mapping

PREFIX = "hccl_sim_"


def unlink_segment(seg) -> None:
    """Remove a segment's name (a segment whose name is gone already is fine)."""
    try:
        seg.unlink()
    except FileNotFoundError:
        pass


def segment_name(session: str, rank: int, kind: str, generation: int) -> str:
    """A rank's segment's name. It carries the owning process's pid: a rank whose process died and
    was replaced (a fault plan's crash on Ray) must not reuse its predecessor's names, which peers
    may still hold mapped (with the old size and contents)."""
    return f"{PREFIX}{session}_{rank}_{kind}_{os.getpid()}_{generation}"


class OwnedSegments:
    """The segments one rank owns, one per kind ("input", "output", "scratch"), grown on demand."""

    def __init__(self, session: str, rank: int):
        self.session, self.rank = session, rank
        self._segs = {}
        self._generation = 0

    def get(self, kind: str, nbytes: int):
        """(name, shared memory) of at least nbytes for `kind`."""
        seg = self._segs.get(kind)
        if seg is None or seg.size < nbytes:
            if seg is not None:
                self._drop(seg)
            self._generation += 1
            name = segment_name(self.session, self.rank, kind, self._generation)
            seg = Mapping(name, create_bytes=max(int(nbytes), 1), header_bytes=0)
            self._segs[kind] = seg
        return seg

    def array(self, kind: str, shape, dtype) -> tuple:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        seg = self.get(kind, nbytes)
        return seg.name, np.ndarray(shape, dtype=dtype, buffer=seg.buf)

    def segments(self):
        """The live segments, for finding which one holds an address."""
        return list(self._segs.values())

    @staticmethod
    def _drop(seg):
        try:
            seg.close()
        except BufferError:
            pass          # a view is still alive; the name is gone anyway once unlinked
        unlink_segment(seg)

    def close(self):
        for seg in self._segs.values():
            self._drop(seg)
        self._segs.clear()


class PrivateSegment:
    """A segment holding one array for its whole life (a device allocation, a collective's result).

    The array is a view of the segment; the segment is unlinked when the array is garbage
    collected (or `release` is called), so a result can be handed to user code without a copy."""

    _counter = 0

    @classmethod
    def array(cls, session: str, rank: int, kind: str, shape, dtype):
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        cls._counter += 1
        name = f"{PREFIX}{session}_{rank}_{kind}_{os.getpid()}_{cls._counter}"
        seg = Mapping(name, create_bytes=max(nbytes, 1), header_bytes=0)
        arr = np.ndarray(shape, dtype=dtype, buffer=seg.buf)
        weakref.finalize(arr, _unlink_later, seg)
        return name, arr


def _unlink_later(seg):
    unlink_segment(seg)
    try:
        seg.close()
    except BufferError:
        pass


class AttachedSegments:
    """Peers' segments, attached once by name."""

    def __init__(self):
        self._segs = {}
        self.recent = set()

    def array(self, name: str, shape, dtype, offset: int = 0) -> np.ndarray:
        seg = self._segs.get(name)
        if seg is None:
            seg = Mapping(name, header_bytes=0)
            self._segs[name] = seg
        return np.ndarray(shape, dtype=np.dtype(dtype), buffer=seg.buf, offset=offset)

    def __len__(self):
        return len(self._segs)

    def forget(self, keep=()):
        for name in [n for n in self._segs if n not in keep]:
            try:
                self._segs.pop(name).close()
            except BufferError:
                pass

    def close(self):
        self.forget()


def _host() -> str:
    return "".join(c for c in socket.gethostname() if c.isalnum())[:16] or "host"


def new_session() -> str:
    """A session id naming its driver (host, pid), so orphans can be recognised later."""
    return f"{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def sweep_orphans() -> int:
    """Unlink segments of sessions whose driver ran on this host and is no longer alive."""
    host = _host()
    orphans = []
    for path in leftovers():
        parts = os.path.basename(path)[len(PREFIX):].split("-", 2)
        if len(parts) == 3 and parts[0] == host and parts[1].isdigit() and not os.path.exists(f"/proc/{parts[1]}"):
            orphans.append(path)
    return _unlink(orphans)


def leftovers(session: str | None = None) -> list:
    """Segment files of a session (or of every session) still in /dev/shm."""
    return sorted(glob.glob(f"/dev/shm/{PREFIX}{session + '_' if session else ''}*"))


def cleanup(session: str) -> int:
    """Unlink every segment of a session; returns how many were left behind."""
    return _unlink(leftovers(session))


def cleanup_rank(session: str, rank: int) -> int:
    """Unlink the segments one rank of a session owns on this host (its process died without
    closing them); returns how many there were. The session's control block is not a rank's."""
    return _unlink(glob.glob(f"/dev/shm/{PREFIX}{session}_{int(rank)}_*"))


def _unlink(paths) -> int:
    removed = 0
    for path in paths:
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
    return removed
