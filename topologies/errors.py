"""HcclError: the one exception family of hccl-sim, with HCCL's HcclResult codes.

It lives in the lowest layer (topologies) so that every layer above can raise it without
depending upward: a malformed rank table (topologies), a transport deadline (hcomm) and a
mismatched collective (hccl_sim) all surface as the same exception type.
Codes and numbers are HCCL's `HcclResult` (hccl_types.h; docs/references.md §9.1).

Besides its code and message, an error carries what happened as data, for the code that reacts
to it (engines, op retry, the chaos checker) to decide from fields, never from message text:
its cause (one of `Cause`), the peer ranks involved, the failed link and its retry level, the
simulated time, the fault-plan entry behind it and cause-specific details. Messages are for
people; they say the same things in HCCL's wording.
"""
from __future__ import annotations

HCCL_RESULT = {
    "SUCCESS": 0, "E_PARA": 1, "E_PTR": 2, "E_MEMORY": 3, "E_INTERNAL": 4,
    "E_NOT_SUPPORT": 5, "E_NOT_FOUND": 6, "E_UNAVAIL": 7, "E_SYSCALL": 8, "E_TIMEOUT": 9,
    "E_OPEN_FILE_FAILURE": 10, "E_TCP_CONNECT": 11, "E_ROCE_CONNECT": 12,
    "E_TCP_TRANSFER": 13, "E_ROCE_TRANSFER": 14, "E_RUNTIME": 15, "E_DRV": 16,
    "E_PROFILING": 17, "E_CCE": 18, "E_NETWORK": 19, "E_AGAIN": 20, "E_REMOTE": 21,
    "E_SUSPENDING": 22, "E_OPRETRY_FAIL": 23, "E_OOM": 24, "E_IN_STATUS": 1041,
}


class Cause:
    """What an HcclError says happened (`HcclError.cause`; None: not classified). Plain strings,
    so that they cross every process boundary (pickles, JSON frames, MPI outcome dicts) as they are.

    Consequences (CONSEQUENCES) are errors a rank gets because of something that happened to
    another: they name that rank (`peers`) and are never a job's root cause while another error is
    (hccl_sim.engines.rendezvous.root_cause)."""
    PEER_FAILED = "PEER_FAILED"        # a peer failed: its error (peers: that rank)
    PEER_RETURNED = "PEER_RETURNED"    # a peer returned without calling the op, or without sending or receiving
    #                                    what this rank waits for (detail "missed": "call" | "send" | "receive")
    PEER_LOST = "PEER_LOST"            # a peer's process or endpoint went away (its transport or control plane says so)
    ABORTED = "ABORTED"                # the wait was aborted: comm.abort(), a failing rank's abort, the driver's stop
    TIMEOUT = "TIMEOUT"                # a wait passed its deadline (HCCL_EXEC_TIMEOUT, connect), or a deadlock
    LINK_FAILED = "LINK_FAILED"        # an error CQE: retransmissions over a failed link exhausted, no op retry
    OPRETRY_FAIL = "OPRETRY_FAIL"      # op retry on for the link's level but refused or exhausted
    #                                    (detail "refused": "in-place" | "left" | "exhausted", "max_cnt", "tries")
    RANK_LOST = "RANK_LOST"            # the fault plan crashed a peer, found LOST by the heartbeat or a notify
    #                                    wait's HCCL_EXEC_TIMEOUT (detail "crashed_ns", "detected_by")
    RANK_DIED = "RANK_DIED"            # this rank's own process died (the Ray driver's outcome of a dead actor)
    NO_MEMORY = "NO_MEMORY"            # an HBM allocation of this rank's failed (HCCL's EI0011 in link setup): the
    #                                    device is full, or the fault plan's hbm_pressure holds what is free
    MISMATCH = "MISMATCH"              # the ranks' calls of one collective differ
    BAD_INPUT = "BAD_INPUT"            # an argument of this rank's call is invalid


CAUSES = frozenset(v for k, v in vars(Cause).items() if k.isupper())
CONSEQUENCES = frozenset({Cause.PEER_FAILED, Cause.PEER_RETURNED, Cause.PEER_LOST, Cause.ABORTED})
FIELDS = ("time_ns", "cause", "peers", "link", "level", "fault", "detail")
"""HcclError's data besides code, message, rank and op: `HcclError(code, reason, rank=, op=,
**err.fields())` is the same error."""


class HcclError(RuntimeError):
    """An error with an HCCL result code (`.code`, e.g. "E_PARA") and, when known, the rank.

    The message names the rank, the operation and the cause, as HCCL's error logs do. The same
    facts as data (all optional, keyword-only): `cause` (a Cause), `peers` (the ranks involved:
    the peer that failed, returned or was lost; the ranks missing), `link` ((src, dst) of the
    failed transfer), `level` ("L0" | "L1" | "L2": the link's op-retry level), `time_ns` (the
    simulated clock at which the failure was detected), `fault` (the label of the fault-plan
    entry behind it, "fault plan entry i (kind ...)") and `detail` (cause-specific: see Cause).
    """

    def __init__(self, code: str, message: str, rank: int | None = None, op: str | None = None,
                 time_ns: int | None = None, *, cause: str | None = None, peers=(), link=None,
                 level: str | None = None, fault: str | None = None, detail=None):
        if code not in HCCL_RESULT:
            raise ValueError(f"unknown HCCL result code {code!r}")
        if cause is not None and cause not in CAUSES:
            raise ValueError(f"unknown HcclError cause {cause!r}")
        self.code = code
        self.value = HCCL_RESULT[code]
        self.rank = rank
        self.op = op
        self.time_ns = time_ns      # the simulated clock at which the failure was detected, if known
        self.cause = cause
        self.peers = (int(peers),) if hasattr(peers, "__index__") else tuple(int(p) for p in peers)
        self.link = None if link is None else (int(link[0]), int(link[1]))
        self.level = level
        self.fault = fault
        self.detail = dict(detail) if detail else {}
        prefix = []
        if rank is not None:
            prefix.append(f"rank {rank}")
        if op is not None:
            prefix.append(op)
        where = f"[{', '.join(prefix)}] " if prefix else ""
        self.reason = message
        super().__init__(f"HCCL_{code} ({self.value}): {where}{message}")

    @property
    def peer(self) -> int | None:
        """The first of `peers` (the peer that failed, returned or was lost), or None."""
        return self.peers[0] if self.peers else None

    @property
    def consequence(self) -> bool:
        """Whether this error is a consequence of something that happened to another rank (a
        peer failed, returned, was lost, or the op was aborted): never a job's root cause while
        another error is."""
        return self.cause in CONSEQUENCES

    def fields(self) -> dict:
        """The error's data besides code, message, rank and op (FIELDS), as plain values."""
        return {"time_ns": self.time_ns, "cause": self.cause, "peers": self.peers, "link": self.link,
                "level": self.level, "fault": self.fault, "detail": dict(self.detail)}

    def replace(self, **changes) -> "HcclError":
        """The same error with some of code, message, rank, op or FIELDS changed (as another
        rank reports it, say); attributes set after construction (remote_traceback) are kept."""
        kw = {"code": self.code, "message": self.reason, "rank": self.rank, "op": self.op, **self.fields()}
        kw.update(changes)
        new = type(self)(kw.pop("code"), kw.pop("message"), **kw)
        for k, v in self._extra().items():
            setattr(new, k, v)
        return new

    def _extra(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in _OWN}

    def __reduce__(self):
        # positional (code, message, rank, op, time_ns) as before; the fields and any attribute
        # set since (remote_traceback) as state
        return (type(self), (self.code, self.reason, self.rank, self.op, self.time_ns),
                {**{k: v for k, v in self.fields().items() if k != "time_ns"}, **self._extra()})


_OWN = frozenset(("code", "value", "rank", "op", "reason") + FIELDS)
