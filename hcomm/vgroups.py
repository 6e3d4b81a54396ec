"""Steps made of groups of ranks that repeat, priced once per group (hcomm.vtiming).

hccl_sim places one sub-collective's step on many groups of ranks at once: every server runs the
same level0 step, the same-index cards of every server the same level1 step (hccl_sim's
`algorithms.common.tile`). Such a step says so in its `groups`: its parts (`Part`), each a base
step of n ranks and the (G, n) ranks it runs on. The step's timing is its base step's, group by
group, when
- no rank is in two groups: ports and engines belong to ranks, so groups never contend, and a
  part lists its groups one after another, each in its base step's issue order;
- every group routes as the first (CostModel.routes_alike): the same latency, rates and notify
  cost per transfer, and the same ports shared.
Then the base step is routed and priced once, on the first group's routes (CostModel.group), and
moves every group's clocks: as one row of n clocks where the groups' clocks are equal (groups
that entered together), else as a (G, n) array.

Parts on the same groups (A3's double ring: both halves of a loop on every server, in one
global step) are merged group by group: the groups a set of parts share form a class, whose base
step is the parts' base steps one after another (the order the whole step lists them in, group
by group), renumbered to the class's first part's columns. A step whose groups overlap otherwise,
route differently or sit on a topology without an analytic router is priced whole, as before.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .program import ARRAYS, GlobalStep, LazyStep, TimingView, concat_steps, counts
from .vprep import prep_for, step_key

_MOST_PARTS = 62          # parts of one step told apart by the bits of an int64


class Part(NamedTuple):
    """A step that repeats: `base` (a step of n ranks, numbered 0..n-1) placed on every row of
    `ranks` (G, n), its rank i being ranks[g, i] in group g; `key` names `ranks`. A step's
    `groups` is the tuple of its parts, in listing order (every transfer of part k before any of
    part k + 1, group by group)."""
    base: object
    ranks: np.ndarray
    key: object


class _Class(NamedTuple):
    """Groups that the same parts run on: `ranks` (G, n), the cost model of the first group, and
    (part index, its columns in `ranks` or None where they are `ranks`'s own) per part."""
    ranks: np.ndarray
    cost: object
    parts: tuple


class Grouped(NamedTuple):
    """A step priced by groups: (ranks (G, n), the base step's hcomm.vprep.Prep) per class; `key`
    as Prep's (steps priced alike), or None."""
    classes: list
    key: object


def _columns(ranks: np.ndarray, other: np.ndarray):
    """The columns of `ranks` that hold `other`'s, for every row (other[g, j] == ranks[g, cols[j]]);
    None when `other`'s rows are not `ranks`'s rows reordered alike."""
    if other.shape != ranks.shape:
        return None
    order = np.argsort(ranks[0], kind="stable")
    at = np.minimum(np.searchsorted(ranks[0], other[0], sorter=order), ranks.shape[1] - 1)
    cols = order[at]
    return cols if np.array_equal(ranks[:, cols], other) else None


def _distinct_ranks(ranks: np.ndarray, p: int) -> bool:
    flat = ranks.reshape(-1)
    return not len(flat) or (int(flat.min()) >= 0 and int(flat.max()) < p and int(np.bincount(flat).max()) <= 1)


def _classes(parts, cost):
    """The step's classes of groups, or None when its parts cannot be priced by group."""
    p = cost.num_ranks
    if any(part.ranks.ndim != 2 or not part.ranks.size or not _distinct_ranks(part.ranks, p) for part in parts):
        return None
    if len(parts) == 1:
        found = [(parts[0].ranks, ((0, None),))]
    else:
        if len(parts) > _MOST_PARTS:
            return None
        # a group is named by its smallest rank; groups of different parts with one name must be
        # the same ranks (checked column by column below)
        lows = [part.ranks.min(axis=1) for part in parts]
        names, where = np.unique(np.concatenate(lows), return_inverse=True)
        member = np.zeros(len(names), dtype=np.int64)
        np.bitwise_or.at(member, where, np.repeat(np.int64(1) << np.arange(len(parts), dtype=np.int64),
                                                  [len(low) for low in lows]))
        found = []
        for bits in np.unique(member):
            rows = names[member == bits]
            ks = [k for k in range(len(parts)) if int(bits) >> k & 1]
            picked = []
            for k in ks:
                order = np.argsort(lows[k], kind="stable")
                pos = order[np.searchsorted(lows[k], rows, sorter=order)]
                whole = len(pos) == len(lows[k]) and bool((pos == np.arange(len(pos))).all())
                picked.append(parts[k].ranks if whole else parts[k].ranks[pos])
            members = [(ks[0], None)]
            for k, ranks in zip(ks[1:], picked[1:]):
                cols = _columns(picked[0], ranks)
                if cols is None:
                    return None
                members.append((k, None if np.array_equal(cols, np.arange(len(cols))) else cols))
            found.append((picked[0], tuple(members)))
        if not _distinct_ranks(np.concatenate([ranks.reshape(-1) for ranks, _ in found])[None, :], p):
            return None
    if not all(cost.routes_alike(ranks) for ranks, _ in found):
        return None
    return [_Class(ranks, cost.group(ranks[0]), members) for ranks, members in found]


def _renumbered_full(st: GlobalStep, cols) -> GlobalStep:
    new = GlobalStep()
    for name in ARRAYS:
        setattr(new, name, getattr(st, name))
    new.t_src, new.t_dst, new.c_rank, new.g_rank = (cols[np.asarray(getattr(st, name), dtype=np.int64)]
                                                    for name in ("t_src", "t_dst", "c_rank", "g_rank"))
    return new


def _renumbered(view, cols) -> TimingView:
    expand = view.expand
    src, dst, c_rank, g_rank = (cols[np.asarray(a, dtype=np.int64)] for a in (view.t_src, view.t_dst, view.c_rank,
                                                                              view.g_rank))
    return TimingView(src, dst, view.t_bytes, view.t_rbuf, c_rank, view.c_bytes, g_rank, view.g_bytes, counts(view),
                      None if expand is None else (lambda: _renumbered(expand(), cols)))


def _class_step(parts, members):
    """A class's base step: its parts' base steps in listing order, renumbered to its columns."""
    steps = []
    for k, cols in members:
        base = parts[k].base
        if cols is None:
            steps.append(base)
            continue
        key = step_key(base)
        steps.append(LazyStep(lambda base=base, cols=cols: _renumbered_full(base.full(), cols),
                              lambda base=base, cols=cols: _renumbered(base.timing(), cols),
                              None if key is None else ("renumbered", key, cols.tobytes())))
    return concat_steps(steps)


def grouped(st, cost, dtype, redop):
    """The step priced by groups (a Grouped), or None when it is to be priced whole."""
    parts = st.groups
    if not parts:
        return None
    layouts = cost.cache("group_layouts")
    names = tuple(part.key for part in parts)
    classes = layouts.get(names)
    if classes is None:
        classes = layouts[names] = _classes(parts, cost) or ()
    if not classes:
        return None
    mine = ("groups", cost.key)
    bases = st.cache.get(mine)
    if bases is None:
        bases = st.cache[mine] = [_class_step(parts, cls.parts) for cls in classes]
    preps = [(cls.ranks, prep_for(base, cls.cost, dtype, redop, cls.ranks.shape[1], cls.cost.cache("vtiming")))
             for cls, base in zip(classes, bases)]
    keys = tuple(pr.key for _, pr in preps)
    return Grouped(preps, ("groups", names, keys) if all(k is not None for k in keys) else None)
