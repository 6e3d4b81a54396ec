"""Typed messages of the Ray engine: what crosses between the driver, the rank actors and the
control plane. Nothing positional: every message is a small frozen dataclass.

- RankInfo      an actor's answer at start-up: where it runs (Ray node id, pid).
- RunSpec       the driver's instructions for one run: the session, the data plane, the peers'
                transport addresses, the run's Config (HCCL settings and faults).
- Outcome       an actor's answer for one run: its result, or its error (code, reason, when), and
                the rank a fault plan crashed under it; or, made by the driver, its actor's death.
- RankStatus    what a rank is waiting for, for the driver's stall watch.
- CallPayload   a rank's side of a collective's rendezvous (signature, entry clock, item size,
                an eager op's input), the bytes the control plane's allgather carries.
- SharedBuffers a rank's buffers on the shared-memory data plane: segment names and shapes.
"""
from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass, field
from typing import Any, Optional

from topologies.errors import HcclError


@dataclass(frozen=True)
class RankInfo:
    rank: int
    pid: int
    node_id: str
    node_ip: str
    rss_mb: float


@dataclass(frozen=True)
class RunSpec:
    session: str
    plane: str                          # "shm" | "socket" | "object"
    peers: dict = field(default_factory=dict)   # rank -> (host, port) of its socket transport
    config: Any = None                  # this run's hccl_sim.env.Config (None: the actor's own)


@dataclass(frozen=True)
class Outcome:
    rank: int
    ok: bool
    value: Any = None
    code: Optional[str] = None          # HcclResult name for an HcclError, None for another exception
    reason: str = ""
    op: Optional[str] = None
    error_type: str = ""
    traceback: str = ""
    at: float = 0.0                     # time.time() when the error was caught (earliest = root cause)
    lost: tuple = ()                    # the job's ranks the fault plan crashed in this rank's ops
    died: bool = False                  # the rank's actor process died (its outcome is the driver's)

    def error(self) -> HcclError:
        if self.code:
            return HcclError(self.code, self.reason, rank=self.rank, op=self.op)
        return HcclError("E_INTERNAL", f"{self.error_type}: {self.reason}\n{self.traceback}".rstrip(), rank=self.rank)

    @property
    def secondary(self) -> bool:
        """An error caused by another rank's failure (an abort, a lost or departed peer)."""
        if self.died:
            return False                # the dead rank itself: the root cause
        return self.code in ("E_REMOTE",) or self.reason.startswith("aborted")


@dataclass(frozen=True)
class RankStatus:
    rank: int
    waiting: Optional[str]              # what it waits for, None when running
    progress: int                       # waits completed so far (changes whenever it moves)


class CallPayload:
    """A rank's call in the control plane's fixed binary layout: item size, the pickled signature,
    the entry clock, the rank's sends on the pairs its fault plan counts (Call.sent, int64s: none
    without a corrupt entry) and, for an eager op, its input's raw bytes (MPI's eager protocol).
    Everything before the clock is the same bytes on every rank that made the same call, so the
    common case is one prefix compare per rank and nothing to decode."""
    _HEAD = struct.Struct("<qIII")          # itemsize, signature bytes, eager bytes (or 2^32-1: none), sent counts
    _CLOCK = struct.Struct("<q")
    _NONE = 0xFFFFFFFF
    __slots__ = ("signature", "clock", "itemsize", "eager", "sent")

    def __init__(self, signature: bytes, clock: int, itemsize: int, eager, sent: tuple = ()):
        self.signature, self.clock, self.itemsize, self.eager, self.sent = signature, clock, itemsize, eager, sent

    @staticmethod
    def signature_bytes(signature) -> bytes:
        return pickle.dumps(tuple(signature), protocol=pickle.HIGHEST_PROTOCOL)

    def encode(self) -> bytes:
        eager = self.eager
        head = self._HEAD.pack(self.itemsize, len(self.signature), self._NONE if eager is None else len(eager),
                               len(self.sent))
        sent = struct.pack(f"<{len(self.sent)}q", *self.sent)
        return head + self.signature + self._CLOCK.pack(self.clock) + sent + (eager or b"")

    @classmethod
    def decode(cls, raw: bytes) -> "CallPayload":
        itemsize, ns, ne, nsent = cls._HEAD.unpack_from(raw)
        at = cls._HEAD.size + ns
        clock, = cls._CLOCK.unpack_from(raw, at)
        sent = struct.unpack_from(f"<{nsent}q", raw, at + 8)
        at += 8 + 8 * nsent
        return cls(raw[cls._HEAD.size:cls._HEAD.size + ns], clock, itemsize,
                   None if ne == cls._NONE else raw[at:at + ne], sent)

    @classmethod
    def agreed(cls, raws: list, rank: int, signature_len: int):
        """(every rank's clock, every rank's sent counts, every rank's eager bytes) when every
        payload in `raws` carries the same call as raws[rank] (item size, signature, eager size and
        the number of sent counts equal as bytes), else None."""
        at = cls._HEAD.size + signature_len
        same = raws[rank][:at]
        for r in raws:
            if not r.startswith(same):
                return None
        nsent = cls._HEAD.unpack_from(same)[3]
        unpack = cls._CLOCK.unpack_from
        clocks = [unpack(r, at)[0] for r in raws]
        at += 8
        sent = [struct.unpack_from(f"<{nsent}q", r, at) for r in raws] if nsent else None
        at += 8 * nsent
        return clocks, sent, [r[at:] for r in raws]

    def signature_object(self, signature_type):
        return signature_type(*pickle.loads(self.signature))


@dataclass(frozen=True)
class SharedBuffers:
    input: tuple                        # (segment name, shape)
    output: tuple
    scratch: Optional[tuple]
    dtype: str

    def encode(self) -> bytes:
        return pickle.dumps((self.input, self.output, self.scratch, self.dtype), protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def decode(raw: bytes) -> "SharedBuffers":
        return SharedBuffers(*pickle.loads(raw))
