"""What a fault plan has done so far on one communicator, which the plan of its next op needs.

Three things carry over from op to op (docs/design.md, "Faults contract"):
- transfers counted on every pair a `corrupt` entry names: the entry's nth transfer a -> b is
  counted over the whole job in op order (every transfer of every collective's program, loop by
  loop, and every point-to-point send a -> b), so the plan of an op must know how many came before
  it to find the corrupted one among its own;
- the dies that switched to their package partner's NIC (A3's backup NIC, docs/references.md §10.5):
  once per NPU, no switch back, so every later op runs on the borrowed routes;
- under hbm_pressure entries, the (op, algorithm) pairs whose links the communicator has set up:
  HCCL sets up links on the first call of each op type and algorithm of a communicator
  (docs/references.md §10.2), and only a setup allocates device memory that a pressure can deny.

Every rank plans every op identically (the Ray engine, each rank with its own PlanCache), or the
group plans it once (the local engine), and advances its FaultProgress by the same plans in the same
order: the counts are the same everywhere. Point-to-point sends are known only to their two ends, so
each rank's Call at a rendezvous carries its own sends on the counted pairs (`sent_by`), and every
planner adds them up. Likewise only a rank's own device knows whether a pressure starves its link
setup (hccl_sim.faults.hbm): its Call carries that too, after the counts.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

EXCHANGE = -1
"""The setup word of a call that is a communicator's bootstrap exchange (comm.split's gathers): it
stands for host-socket negotiation, not an HCCL op, and sets up no links."""


class OpFaults(NamedTuple):
    """What the plan of one op takes from the progress so far."""
    corrupt: tuple = ()     # ((src, dst, k, label), ...): the op's transfer k (0-based) src -> dst is
                            # corrupted, if the op has more than k of them
    backup: tuple = ()      # dies on their partner's NIC when the op starts (sorted)
    starved: tuple = ()     # ((rank, label), ...): ranks whose hbm_pressure entry leaves a link setup no memory
    links: Optional[frozenset] = None   # (op, algo) pairs set up so far; None: the op sets none up


NO_FAULTS = OpFaults()


def sets_up_links(sig) -> bool:
    """Whether a call with signature `sig` has links to set up: a call of count 0 does nothing at
    all (HCCL returns success at its entry: `CHK_PRT_RET(count == 0, ...)` in every op)."""
    return math.prod(sig.shape) > 0


def link_setup_starved(now: OpFaults, sig, algo: str) -> tuple:
    """The starved ranks ((rank, label), ...) that fail this call's link setup, or (): it is the
    first call of its op type and algorithm on the communicator that sets links up."""
    if not now.starved or now.links is None or (sig.name, algo) in now.links or not sets_up_links(sig):
        return ()
    return now.starved


class FaultProgress:
    """One communicator's progress through a bound fault plan (hccl_sim.faults.fault_plan.BoundFaults)."""

    def __init__(self, faults=None):
        self.entries = () if faults is None else faults.corrupt
        self.pairs = tuple(sorted({(a, b) for a, b, _, _ in self.entries}))
        self.collective = dict.fromkeys(self.pairs, 0)     # transfers of collectives so far, per pair
        self.backup = ()
        self.pressures = () if faults is None else tuple(p[-1] for p in faults.pressures)   # their labels
        self.links = set()                 # (op, algo) pairs set up (kept under hbm_pressure entries only)
        self.carries = bool(self.pairs or self.pressures)
        """Whether a rank's Call carries words for this progress (`sent_by`)."""

    def __repr__(self):
        return f"<FaultProgress {self.collective} backup={self.backup}>"

    def sent_by(self, rank: int, p2p_sent: dict, setup: int = 0) -> tuple:
        """What `rank`'s Call carries: its point-to-point sends so far on every counted pair (0 on
        pairs it is not the source of); `p2p_sent` maps a destination to this rank's sends there.
        Under hbm_pressure entries one more word, `setup`: 1 + the index of the pressure that
        starves the rank's link setup, 0 for none, EXCHANGE for a bootstrap exchange."""
        counts = tuple(p2p_sent.get(b, 0) if a == rank else 0 for a, b in self.pairs)
        return counts + (setup,) if self.pressures else counts

    def before(self, sent=None) -> OpFaults:
        """What the next op's plan needs, from every rank's `sent_by` (None: no sends yet)."""
        if self.pressures:
            n = len(self.pairs)
            words = [s[n] if len(s) > n else 0 for s in sent or ()]
            exchange = EXCHANGE in words
            starved = () if exchange else tuple((r, self.pressures[w - 1]) for r, w in enumerate(words) if w > 0)
            now = self._counted([s[:n] for s in sent] if sent else sent)
            return now._replace(starved=starved, links=None if exchange else frozenset(self.links))
        return self._counted(sent)

    def _counted(self, sent) -> OpFaults:
        if not self.entries:
            return OpFaults((), self.backup) if self.backup else NO_FAULTS
        p2p = [sum(column) for column in zip(*sent)] if sent else [0] * len(self.pairs)
        if len(p2p) != len(self.pairs):
            p2p = [0] * len(self.pairs)        # calls without counts (an engine that sends none)
        done = {pair: self.collective[pair] + n for pair, n in zip(self.pairs, p2p)}
        due = tuple((a, b, nth - done[(a, b)], label) for a, b, nth, label in self.entries if nth >= done[(a, b)])
        return OpFaults(due, self.backup)

    def after(self, plan, now: OpFaults = NO_FAULTS) -> None:
        """Advance by a plan made from `before` (`now`): its transfers on the counted pairs, its
        dies on backup NICs, the links it set up (a plan is made only if its setup succeeded)."""
        for pair, n in (plan.transfers or {}).items():
            self.collective[pair] += n
        self.backup = tuple(plan.backup)
        if now.links is not None and sets_up_links(plan.signature):
            self.links.add((plan.signature.name, plan.algo))

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
