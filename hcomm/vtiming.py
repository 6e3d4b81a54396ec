"""The timing model, vectorised over ranks: a program's simulated times without payload.

Same rules as the event-driven reference (hcomm.timing.replay), applied a global step at a
time. Two facts make that exact:
- Ports and device engines belong to one NPU, and a rank starts step t+1 only after all of its
  step-t transfers have completed, so no port or engine is ever still busy from an earlier step
  when a later one begins: contention happens only among the transfers of one step.
- Both ends of every transfer are in the same global step (programs are aligned), so a step's
  transfers are ready at max(sender clock, receiver clock) + notify.
Within a step, transfers sharing a port (or a receiver's reduce engine) are served in
(ready, sender, receiver, listing) order, as the reference serves them. A step where no two
transfers share a port or an engine, which is most steps of most algorithms, costs a handful of
array operations (rotations, when rank r sends to r + k); otherwise the step's transfers are
levelled along their resource chains and each level is one vectorised update (hcomm.vcontention).

Each step's prices come from hcomm.vprep (a step is routed and priced once per structure, its
pairs and runs of block transfers priced as one), or, for a step that repeats over groups of
ranks, from hcomm.vgroups: its base step priced once and moving the distinct rows of the
groups' clocks, which a run of steps on the same groups keeps gathered. Steps priced alike form
runs that the uniform-shift rule finishes in one addition.
"""
from __future__ import annotations

import numpy as np

from .cost import as_cost
from .vcontention import contended, maximum_at
from .vgroups import Grouped, grouped
from .vprep import Prep, prep_for, step_key

_I64 = np.int64


def _step(pr: Prep, clock):
    """Clocks after one step: `clock` holds one clock per rank of the step, or (G, n) clocks of G
    groups that the step moves alike (hcomm.vgroups), every index on the last axis."""
    if pr.n == 0 and not len(pr.l_rank):
        return clock
    if pr.fast and pr.shift is not None:
        # rank r sends to r + k: the perm update below with its gathers as rotations
        p, k = clock.shape[-1], pr.shift
        done = np.maximum(clock, np.concatenate((clock[..., k:], clock[..., :k]), axis=-1))
        done += pr.cost_fwd
        new = np.concatenate((done[..., p - k:], done[..., :p - k]), axis=-1)
        return np.maximum(new, done if pr.nb_zero else done + pr.nb, out=new)
    if pr.fast and pr.perm and pr.src is not None:
        done = np.maximum(clock[..., pr.src], clock[..., pr.dst])
        done += pr.cost_fwd
        new = done[..., pr.inv]            # receive completion, by receiver
        ack = done + pr.nb                 # send completion, by sender
        if pr.src_unique:
            sent = np.empty_like(new)
            sent[..., pr.src] = ack
            np.maximum(new, sent, out=new)
        return new
    new = clock.copy()
    engine = None
    if len(pr.l_rank):
        # local copies and staging run first, serially on each rank's engine
        busy = np.bincount(pr.l_rank, weights=pr.l_cost, minlength=clock.shape[-1]).astype(_I64)
        engine = clock + busy
        np.maximum(new, engine, out=new)
    if pr.n == 0:
        return new
    ready = np.maximum(clock[..., pr.src], clock[..., pr.dst]) + pr.nf
    if pr.fast:
        done = ready + pr.wire + pr.lat + pr.red
    else:
        done = contended(pr, ready, engine, clock)
    if pr.dst_unique:
        new[..., pr.dst] = np.maximum(new[..., pr.dst], done)
    else:
        maximum_at(new, pr.dst, done)
    ack = done + pr.nb
    if pr.src_unique:
        new[..., pr.src] = np.maximum(new[..., pr.src], ack)
    else:
        maximum_at(new, pr.src, ack)
    return new


class _Clocks:
    """Every rank's clock, one flat array (steps priced whole move it)."""
    __slots__ = ("clock",)

    def __init__(self, clock):
        self.clock = clock

    def advanced(self, pr) -> "_Clocks":
        return _Clocks(_step(pr, self.clock))

    def delta(self, old: "_Clocks"):
        """The amount every clock moved by since `old`, or None where they moved unequally."""
        delta = self.clock - old.clock
        return delta[0] if delta.size and delta.min() == delta.max() else None

    def shifted(self, amount) -> "_Clocks":
        return _Clocks(self.clock + amount)


class _GroupClocks:
    """The clocks of consecutive steps priced on the same groups (hcomm.vgroups), gathered from
    the flat clocks once for all of them: per class, the distinct rows of its groups' clocks
    (groups with equal clocks stay equal: they move alike), one row of n clocks where the groups
    entered together, else (U, n) and which row each group has. Ranks in no group keep their
    flat clocks: these steps do not move them."""
    __slots__ = ("ranks", "rows", "which", "whole")

    def __init__(self, ranks, rows, which, whole):
        self.ranks, self.rows, self.which, self.whole = ranks, rows, which, whole

    @classmethod
    def gathered(cls, clock, priced: Grouped) -> "_GroupClocks":
        ranks = tuple(r for r, _ in priced.classes)
        rows, which = [], []
        for r in ranks:
            at = clock[r]
            if (at == at[:1]).all():
                rows.append(at[0].copy())
                which.append(None)
            else:
                distinct, index = np.unique(at, axis=0, return_inverse=True)
                rows.append(distinct)
                which.append(index.reshape(-1))
        return cls(ranks, rows, which, sum(r.size for r in ranks) == len(clock))

    def fits(self, priced: Grouped) -> bool:
        return len(priced.classes) == len(self.ranks) and all(r is mine for (r, _), mine in zip(priced.classes,
                                                                                                 self.ranks))

    def advanced(self, priced: Grouped) -> "_GroupClocks":
        return _GroupClocks(self.ranks, [_step(pr, rows) for (_, pr), rows in zip(priced.classes, self.rows)],
                            self.which, self.whole)

    def delta(self, old: "_GroupClocks"):
        """As _Clocks.delta over every rank: the ranks in no group did not move."""
        amount = None
        for new, before in zip(self.rows, old.rows):
            delta = new - before
            if delta.min() != delta.max() or (amount is not None and delta.flat[0] != amount):
                return None
            amount = delta.flat[0]
        return amount if self.whole or amount == 0 else None

    def shifted(self, amount) -> "_GroupClocks":
        return _GroupClocks(self.ranks, [rows + amount for rows in self.rows], self.which, self.whole)

    def scattered(self, clock):
        """The flat clocks with the groups' put back."""
        clock = clock.copy()
        for r, rows, which in zip(self.ranks, self.rows, self.which):
            clock[r] = rows if which is None else rows[which]
        return clock


def _priced(st, cost, dtype, redop, p, cache):
    """The step's prices: by groups where it repeats (hcomm.vgroups), else whole."""
    return grouped(st, cost, dtype, redop) or prep_for(st, cost, dtype, redop, p, cache)


def program_times(program, entry, cost, dtype="float32", redop="sum"):
    """Every rank's exit clock (ns, int64 array) for a program entered at `entry` clocks, priced
    by `cost` (an hcomm.cost.CostModel; a Topology is taken as its cost model).

    Timing is shift-invariant (every operation is a max or an addition of constants), so when a
    step of a run of identical steps moves every rank's clock by the same amount, each remaining
    step of the run does exactly that too, and the run is finished in one addition."""
    clock = np.asarray(entry, dtype=_I64).copy()
    p = len(clock)
    cost = as_cost(cost)
    cache = cost.cache("vtiming")
    n = len(program)
    t = 0
    ahead = None                              # (index, prep) of a step priced while scanning a run
    groups = None                             # _GroupClocks of the steps on the current groups
    while t < n:
        st = program[t]
        pr = ahead[1] if ahead is not None and ahead[0] == t else _priced(st, cost, dtype, redop, p, cache)
        key = step_key(st)
        run = 1
        if key is not None:
            while t + run < n and step_key(program[t + run]) == key:
                run += 1
        elif pr.key is not None:
            # steps priced alike (same structure, same prices): only their prep tells
            while t + run < n and step_key(program[t + run]) is None:
                ahead = (t + run, _priced(program[t + run], cost, dtype, redop, p, cache))
                if ahead[1].key != pr.key:
                    break
                run += 1
        if isinstance(pr, Grouped):
            if groups is None or not groups.fits(pr):
                if groups is not None:
                    clock = groups.scattered(clock)
                groups = _GroupClocks.gathered(clock, pr)
            groups = _run(pr, groups, run)
        else:
            if groups is not None:
                clock, groups = groups.scattered(clock), None
            clock = _run(pr, _Clocks(clock), run).clock
        t += run
    return clock if groups is None else groups.scattered(clock)


def _run(pr, clocks, run: int):
    """The clocks after `run` steps priced alike: once a step moves every clock by the same
    amount, so does each further one (timing is shift-invariant), and the rest is one addition."""
    done = 0
    while done < run:
        new = clocks.advanced(pr)
        done += 1
        if run - done >= 2 and (done == 1 or done % 4 == 0):
            delta = new.delta(clocks)
            if delta is not None:
                return new.shifted(delta * (run - done))
        clocks = new
    return clocks
