"""What a fault plan has done so far on one communicator, which the plan of its next op needs.

Two things carry over from op to op (docs/design.md, "Faults contract"):
- transfers counted on every pair a `corrupt` entry names: the entry's nth transfer a -> b is
  counted over the whole job in op order (every transfer of every collective's program, loop by
  loop, and every point-to-point send a -> b), so the plan of an op must know how many came before
  it to find the corrupted one among its own;
- the dies that switched to their package partner's NIC (A3's backup NIC, docs/references.md §10.5):
  once per NPU, no switch back, so every later op runs on the borrowed routes.

Every rank plans every op identically (the Ray engine, each rank with its own PlanCache), or the
group plans it once (the local engine), and advances its FaultProgress by the same plans in the same
order: the counts are the same everywhere. Point-to-point sends are known only to their two ends, so
each rank's Call at a rendezvous carries its own sends on the counted pairs (`sent_by`), and every
planner adds them up.
"""
from __future__ import annotations

from typing import NamedTuple


class OpFaults(NamedTuple):
    """What the plan of one op takes from the progress so far."""
    corrupt: tuple = ()     # ((src, dst, k, label), ...): the op's transfer k (0-based) src -> dst is
                            # corrupted, if the op has more than k of them
    backup: tuple = ()      # dies on their partner's NIC when the op starts (sorted)


NO_FAULTS = OpFaults()


class FaultProgress:
    """One communicator's progress through a bound fault plan (hccl_sim.faults.fault_plan.BoundFaults)."""

    def __init__(self, faults=None):
        self.entries = () if faults is None else faults.corrupt
        self.pairs = tuple(sorted({(a, b) for a, b, _, _ in self.entries}))
        self.collective = dict.fromkeys(self.pairs, 0)     # transfers of collectives so far, per pair
        self.backup = ()

    def __repr__(self):
        return f"<FaultProgress {self.collective} backup={self.backup}>"

    def sent_by(self, rank: int, p2p_sent: dict) -> tuple:
        """What `rank`'s Call carries: its point-to-point sends so far on every counted pair (0 on
        pairs it is not the source of); `p2p_sent` maps a destination to this rank's sends there."""
        return tuple(p2p_sent.get(b, 0) if a == rank else 0 for a, b in self.pairs)

    def before(self, sent=None) -> OpFaults:
        """What the next op's plan needs, from every rank's `sent_by` (None: no sends yet)."""
        if not self.entries:
            return OpFaults((), self.backup) if self.backup else NO_FAULTS
        p2p = [sum(column) for column in zip(*sent)] if sent else [0] * len(self.pairs)
        if len(p2p) != len(self.pairs):
            p2p = [0] * len(self.pairs)        # calls without counts (an engine that sends none)
        done = {pair: self.collective[pair] + n for pair, n in zip(self.pairs, p2p)}
        due = tuple((a, b, nth - done[(a, b)], label) for a, b, nth, label in self.entries if nth >= done[(a, b)])
        return OpFaults(due, self.backup)

    def after(self, plan) -> None:
        """Advance by a plan made from `before`: its transfers on the counted pairs, its dies on
        backup NICs."""
        for pair, n in (plan.transfers or {}).items():
            self.collective[pair] += n
        self.backup = tuple(plan.backup)

    def p2p_crc(self, src: int, dst: int, sent_before: int):
        """The label of the corrupt entry that hits a send src -> dst after `sent_before` earlier
        sends on the pair, or None."""
        if not self.entries:
            return None
        index = self.collective.get((src, dst), 0) + sent_before
        for a, b, nth, label in self.entries:
            if (a, b) == (src, dst) and nth == index:
                return label
        return None
