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

A step's transfers of one sender to one receiver issued one after another are priced as one
(their wire times summed, one latency), and a run of equal ones is routed and priced once with its
multiplicity (hcomm.program.compact_timing): a step of millions of block transfers (NHR, NB on
thousands of servers) costs what its pairs cost.

A step is priced once per structure: steps with one timing key share a precomputation, steps of
one structure only re-price their bytes, and the steps of a ring phase (rotations of one chunk
pattern) rotate the pattern's prices; steps priced alike form runs that the uniform-shift rule
finishes in one addition.
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


def _grouped_step(priced: Grouped, clock):
    """Clocks after a step priced by groups: each class's base step on its groups' clocks, on
    one row of them where the groups' clocks are equal."""
    new = clock.copy()
    for ranks, pr in priced.classes:
        at = clock[ranks]
        new[ranks] = _step(pr, at[0]) if (at == at[:1]).all() else _step(pr, at)
    return new


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
        done = 0
        while done < run:
            new = _grouped_step(pr, clock) if isinstance(pr, Grouped) else _step(pr, clock)
            done += 1
            if run - done >= 2 and (done == 1 or done % 4 == 0):
                delta = new - clock
                if delta.size and delta.min() == delta.max():
                    clock = new + delta[0] * (run - done)
                    done = run
                    break
            clock = new
        t += run
    return clock
