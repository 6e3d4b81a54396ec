"""The lean path of a repeated eager call on a group whose ranks share no memory (peer_group).

A training step's small collectives (loss scalars, norms, bucket heads, MoE counts) repeat one
call thousands of times. Where ranks are processes, each such op is one control round, after
which every rank computes its own result from every rank's input (MPI's eager protocol,
hcomm.exec.own_result). With 8 ranks on 2 cores each rank runs once per op, after seven other
processes had the core, so what the op costs is mostly how much Python it runs and how much
memory it touches then (experiments/small_op_profile.py measures both, per rank).

An `EagerLane` is what the first run of a call leaves for its repeats: the bytes every rank's
payload starts with (the call itself), the payload's record layout (those bytes, the entry clock,
the input), and by the ranks' relative entry clocks the plans with their compiled own-result
moves. A repeat then packs one record, makes one control round whose plane unpacks every rank's
record in one call where they land (ControlPlane.allgather_records: no bytes object per rank),
checks that every record starts with the same bytes (the same call everywhere, as the general
way checks it), looks its plan up by the relative clocks, and runs the own-result moves: no
signature decoded, no plan object made. Anything else (a rank that made another call, clocks no
cached plan has) goes the group's general way, which says what differs.
"""
from __future__ import annotations

import struct

_PLANS = 64                         # relative-clock patterns kept per call


class EagerLane:
    """One repeated eager call of one rank: `head` (the payload's bytes before the entry clock,
    peer_group.CallPayload.head), and `plans`: relative entry clocks -> (the plan, this rank's
    exit clock relative to the earliest entry, the plan's hcomm.exec.OwnResult for this rank;
    None for a barrier)."""
    __slots__ = ("signature", "op", "head", "plans", "eager_bytes", "record")

    def __init__(self, signature, op: str, head: bytes, eager_bytes: int):
        self.signature, self.op, self.head, self.eager_bytes = signature, op, head, eager_bytes
        self.plans = {}
        # a repeat's payload: the head, the entry clock, the input (the control plane unpacks
        # every rank's at once: ControlPlane.allgather_records)
        self.record = struct.Struct(f"<{len(head)}sq{eager_bytes}s")

    def plan_at(self, clocks: list):
        """(plan, exit clock, own-result moves) kept for these entry clocks' pattern, or None."""
        base = min(clocks)
        hit = self.plans.get(tuple(map(base.__rsub__, clocks)))       # each clock - base
        return None if hit is None else (hit[0], base + hit[1], hit[2])

    def keep(self, clocks: list, plan, exit_clock: int, own) -> None:
        """Remember `plan` (planned for `clocks`; shift-invariant) and its own-result moves `own`
        for this pattern of clocks."""
        if len(self.plans) >= _PLANS:
            self.plans.clear()
        base = min(clocks)
        self.plans[tuple([c - base for c in clocks])] = (plan, exit_clock - base, own)
