"""Programs: a collective's schedule for all ranks at once, as numpy arrays per global step.

A global step holds every transfer of that step (sender, receiver, bytes, the sender's source
slice, the receiver's destination slice and, for a reducing receive, the receiver's operand
slice), every local copy (or local reduce: a copy with an operand slice), and every modelled staging copy. A rank's part of global step t is its
step t (hcomm.steps): the ops run at once, and the rank moves on when all of them have
completed. Because both ends of every transfer sit in the same global step, schedules are
aligned by construction: no deadlock is possible, and a step of all ranks can be priced with a
few array operations (hcomm.vtiming).

From one program come: each rank's step list (`rank_steps`, for ranks that run their own
schedule, and for the reference event-driven replay), the serial data program of the whole op
(`data_moves`, run by `execute` over every rank's buffers, whole or a share of it at a time, where
whoever runs it can address every rank's memory), and the symbolic checks of the tests (`execute`
on symbolic buffers + `hazards`).
"""
from __future__ import annotations

import numpy as np

from .steps import Copy, Recv, Send, Slice, Stage

BUFFERS = ("input", "output", "scratch")
INPUT, OUTPUT, SCRATCH, NONE = 0, 1, 2, -1
_I64 = np.int64


def _arr(x, n):
    a = np.asarray(x, dtype=_I64)
    return np.broadcast_to(a, (n,)) if a.ndim == 0 else a


ARRAYS = ("t_src", "t_dst", "t_bytes", "t_sbuf", "t_slo", "t_shi", "t_dbuf", "t_dlo", "t_dhi",
          "t_rbuf", "t_rlo", "t_rhi", "c_rank", "c_sbuf", "c_slo", "c_shi", "c_dbuf", "c_dlo", "c_dhi",
          "c_bytes", "c_rbuf", "c_rlo", "c_rhi", "g_rank", "g_bytes", "g_dir")
TIMING_ARRAYS = ("t_src", "t_dst", "t_bytes", "t_rbuf", "c_rank", "c_bytes", "c_rbuf", "g_rank", "g_bytes")
_EMPTY = np.empty(0, dtype=_I64)


class GlobalStep:
    """One global step. Transfer arrays are t_*, copy arrays c_*, staging arrays g_*.

    `tkey`, when set, names the step's timing-relevant structure (who sends how many bytes to
    whom, which receives reduce, local copies): steps with equal keys are priced from one
    precomputation. `groups`, when set, says how the step repeats (hcomm.vgroups.Part)."""
    __slots__ = ARRAYS + ("tkey", "skey", "cache", "tview", "groups")
    # a full step is also its own timing view (`timing()`): one transfer per entry, never compacted
    t_count = None
    expand = None

    def __init__(self):
        for name in ARRAYS:
            setattr(self, name, _EMPTY)
        self.tkey = None
        self.skey = None            # names the structure without the bytes (see LazyStep)
        self.cache = {}
        self.tview = None           # a compacted timing view of this step (see `compacted`)
        self.groups = None

    def full(self) -> "GlobalStep":
        return self

    def timing(self):
        return self if self.tview is None else self.tview


class TimingView:
    """Just what the timing model needs of a step.

    `t_count`, when set, is a multiplicity per transfer: entry i stands for t_count[i] transfers
    issued one after another, each of t_bytes[i] bytes between the same two ranks, all reducing
    or all not (a run-length encoding of the step's transfer list, `compact_timing`). The timing
    model prices such a run exactly as the transfers it stands for (hcomm.vtiming).

    `expand`, when set, marks a grouped view: each pair's transfers are consecutive in the step
    and the view lists them there, with multiplicities, but grouped by size rather than in issue
    order; `expand()` gives the transfer list itself, for the timing model to fall back on where
    the order within a pair matters (pairs that cannot be priced as one)."""
    __slots__ = TIMING_ARRAYS + ("t_count", "expand")

    def __init__(self, t_src=_EMPTY, t_dst=_EMPTY, t_bytes=_EMPTY, t_rbuf=_EMPTY, c_rank=_EMPTY, c_bytes=_EMPTY,
                 g_rank=_EMPTY, g_bytes=_EMPTY, t_count=None, expand=None, c_rbuf=None):
        self.t_src, self.t_dst, self.t_bytes, self.t_rbuf = t_src, t_dst, t_bytes, t_rbuf
        self.c_rank, self.c_bytes, self.g_rank, self.g_bytes = c_rank, c_bytes, g_rank, g_bytes
        # which copies reduce (>= 0: a local reduce); none unless given, one entry per copy
        self.c_rbuf = np.full(len(c_rank), NONE, dtype=_I64) if c_rbuf is None else c_rbuf
        self.t_count, self.expand = t_count, expand


def counts(view):
    """A timing view's transfer multiplicities (int64 array), or None when every entry is one transfer."""
    c = view.t_count
    return None if c is None else np.asarray(c, dtype=_I64)


def compact_timing(view):
    """The view with every run of consecutive transfers of one sender to one receiver, of equal
    bytes and all reducing or all not, as one entry with a multiplicity (t_count); the view
    itself when there is no such run. Lossless for timing: `expand_timing` gives the transfer
    list back. A step sending many separate blocks to each peer (NHR, NB on hundreds of servers)
    is then routed and priced per peer, not per block."""
    src = np.asarray(view.t_src)
    n = len(src)
    if n < 2:
        return view
    same = src[1:] == src[:-1]                 # cheap first test: most steps have no runs at all
    if not same.any():
        return view
    dst, nb = np.asarray(view.t_dst), np.asarray(view.t_bytes)
    rf = np.asarray(view.t_rbuf) >= 0
    same &= (dst[1:] == dst[:-1]) & (nb[1:] == nb[:-1]) & (rf[1:] == rf[:-1])
    if not same.any():
        return view
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    old = counts(view)
    count = np.diff(np.append(starts, n)).astype(_I64) if old is None else np.add.reduceat(old, starts)
    return TimingView(src[starts], dst[starts], nb[starts], np.asarray(view.t_rbuf)[starts], view.c_rank,
                      view.c_bytes, view.g_rank, view.g_bytes, count, view.expand, view.c_rbuf)


def expand_timing(view):
    """A compacted view's transfer list, one entry per transfer (the inverse of compact_timing)."""
    if view.expand is not None:
        return view.expand()
    c = counts(view)
    if c is None:
        return view
    rep = lambda a: np.repeat(np.asarray(a), c)       # noqa: E731
    return TimingView(rep(view.t_src), rep(view.t_dst), rep(view.t_bytes), rep(view.t_rbuf), view.c_rank,
                      view.c_bytes, view.g_rank, view.g_bytes, c_rbuf=view.c_rbuf)


def compacted(step: GlobalStep) -> GlobalStep:
    """Give an eager step a compacted timing view when that shrinks it (the data program,
    step.full(), is the step itself, unchanged)."""
    view = compact_timing(step)
    if view is not step:
        step.tview = view
    return step


class RolledView(TimingView):
    """A timing view whose byte counts are a rotation of one pattern, np.roll(pattern, shift), as
    every step of a ring phase is: the timing model prices the pattern once and rotates the
    prices, instead of pricing every step's bytes afresh (hcomm.vtiming)."""
    __slots__ = ("pattern", "shift")

    def __init__(self, t_src, t_dst, pattern, shift: int, t_rbuf):
        self.t_src, self.t_dst, self.t_rbuf = t_src, t_dst, t_rbuf
        self.c_rank = self.c_bytes = self.c_rbuf = self.g_rank = self.g_bytes = _EMPTY
        self.t_count = self.expand = None
        self.pattern, self.shift = pattern, int(shift)

    @property
    def t_bytes(self):
        return np.roll(self.pattern, self.shift)


class LazyStep:
    """A step materialised on demand: programs with thousands of steps over thousands of ranks
    (a flat ring) would not fit in memory as arrays. `timing()` gives the cheap timing view."""
    __slots__ = ("_full", "_timing", "tkey", "skey", "cache", "groups")

    def __init__(self, full, timing=None, tkey=None, skey=None, groups=None):
        """`skey`, when set, names everything the timing model needs except the transfers' byte
        counts (who sends to whom, which receives reduce, local ops): such steps share their
        routes, ports and service order and only re-price their bytes. `groups`: hcomm.vgroups.Part."""
        self._full, self._timing, self.tkey, self.skey, self.cache = full, timing, tkey, skey, {}
        self.groups = groups

    def full(self) -> GlobalStep:
        return self._full()

    def timing(self):
        return self._timing() if self._timing is not None else self._full()


class StepBuilder:
    """Accumulate ops for one global step from (usually vectorised) pieces."""

    def __init__(self):
        self._t, self._c, self._g = [], [], []

    def transfers(self, src, dst, unit, sbuf, slo, shi, dbuf, dlo, dhi=None, rbuf=NONE, rlo=0):
        """dst rank's [dlo, dlo + (shi - slo)) of dbuf receives src rank's [slo, shi) of sbuf;
        with rbuf, it receives the reduction with its own rbuf[rlo, ...)."""
        src = np.asarray(src, dtype=_I64)
        n = src.size
        if n == 0:
            return self
        slo, shi = _arr(slo, n), _arr(shi, n)
        length = shi - slo
        dlo = _arr(dlo, n)
        rb = _arr(rbuf, n)
        rl = _arr(rlo, n)
        self._t.append((src.reshape(-1), _arr(dst, n), length * int(unit), _arr(sbuf, n), slo, shi,
                        _arr(dbuf, n), dlo, dlo + length, rb, rl, np.where(rb >= 0, rl + length, rl)))
        return self

    def copies(self, rank, unit, sbuf, slo, shi, dbuf, dlo, rbuf=NONE, rlo=0):
        """rank's [dlo, dlo + (shi - slo)) of dbuf receives its own [slo, shi) of sbuf; with rbuf,
        the reduction of that with its own rbuf[rlo, ...) (a local reduce)."""
        rank = np.asarray(rank, dtype=_I64).reshape(-1)
        n = rank.size
        if n == 0:
            return self
        slo, shi, dlo = _arr(slo, n), _arr(shi, n), _arr(dlo, n)
        rb, rl = _arr(rbuf, n), _arr(rlo, n)
        self._c.append((rank, _arr(sbuf, n), slo, shi, _arr(dbuf, n), dlo, dlo + (shi - slo), (shi - slo) * int(unit),
                        rb, rl, np.where(rb >= 0, rl + (shi - slo), rl)))
        return self

    def stages(self, rank, nbytes, direction):
        rank = np.asarray(rank, dtype=_I64).reshape(-1)
        if rank.size:
            self._g.append((rank, _arr(nbytes, rank.size), _arr(0 if direction == "in" else 1, rank.size)))
        return self

    def build(self) -> GlobalStep:
        step = GlobalStep()
        if self._t:
            cols = [np.concatenate(c) for c in zip(*self._t)]
            (step.t_src, step.t_dst, step.t_bytes, step.t_sbuf, step.t_slo, step.t_shi, step.t_dbuf, step.t_dlo,
             step.t_dhi, step.t_rbuf, step.t_rlo, step.t_rhi) = cols
        if self._c:
            cols = [np.concatenate(c) for c in zip(*self._c)]
            (step.c_rank, step.c_sbuf, step.c_slo, step.c_shi, step.c_dbuf, step.c_dlo, step.c_dhi,
             step.c_bytes, step.c_rbuf, step.c_rlo, step.c_rhi) = cols
        if self._g:
            step.g_rank, step.g_bytes, step.g_dir = [np.concatenate(c) for c in zip(*self._g)]
        return step

    def empty(self) -> bool:
        return not (self._t or self._c or self._g)


def _concat(steps, names, factory):
    out = factory()
    for name in names:
        parts = [getattr(s, name) for s in steps if len(getattr(s, name))]
        if len(parts) == 1:
            setattr(out, name, parts[0])
        elif parts:
            setattr(out, name, np.concatenate(parts))
    if factory is TimingView and any(counts(s) is not None for s in steps):
        # multiplicities of compacted views; one per entry for the others
        out.t_count = np.concatenate([counts(s) if counts(s) is not None else np.ones(len(s.t_src), dtype=_I64)
                                      for s in steps])
    if factory is TimingView and any(s.expand is not None for s in steps):
        out.expand = lambda: _concat([expand_timing(s) for s in steps], names, TimingView)
    return out


def concat_steps(steps: list):
    """Several groups' steps that run at the same time, as one global step."""
    if len(steps) == 1:
        return steps[0]
    groups = sum((s.groups for s in steps), ()) if all(s.groups is not None for s in steps) else None
    if all(isinstance(s, GlobalStep) for s in steps):
        out = _concat(steps, ARRAYS, GlobalStep)
        if any(s.tview is not None for s in steps):      # keep the parts' compacted timing views
            out.tview = _concat([s.timing() for s in steps], TIMING_ARRAYS, TimingView)
        out.groups = groups
        return out
    keys = tuple(s.tkey for s in steps)
    return LazyStep(lambda: _concat([s.full() for s in steps], ARRAYS, GlobalStep),
                    lambda: _concat([s.timing() for s in steps], TIMING_ARRAYS, TimingView),
                    ("cat",) + keys if all(k is not None for k in keys) else None, groups=groups)


def merge_parallel(programs: list) -> list:
    """Programs on disjoint sets of ranks (or disjoint data), run side by side step for step."""
    longest = max((len(p) for p in programs), default=0)
    return [concat_steps([p[i] for p in programs if i < len(p)]) for i in range(longest)]


# ---- per-rank views --------------------------------------------------------------------------------

def rank_steps(program: list, p: int) -> list:
    """Each rank's list of steps (tuples of hcomm.steps ops), empty steps dropped."""
    out = [[] for _ in range(p)]
    for st in program:
        st = st.full()
        ops = [[] for _ in range(p)]
        for i in range(len(st.t_src)):
            s, d, nb = int(st.t_src[i]), int(st.t_dst[i]), int(st.t_bytes[i])
            ops[s].append(Send(d, Slice(BUFFERS[st.t_sbuf[i]], int(st.t_slo[i]), int(st.t_shi[i])), nb, i))
            rw = None if st.t_rbuf[i] < 0 else Slice(BUFFERS[st.t_rbuf[i]], int(st.t_rlo[i]), int(st.t_rhi[i]))
            ops[d].append(Recv(s, Slice(BUFFERS[st.t_dbuf[i]], int(st.t_dlo[i]), int(st.t_dhi[i])), nb, rw, i))
        for i in range(len(st.c_rank)):
            r = int(st.c_rank[i])
            rw = None if st.c_rbuf[i] < 0 else Slice(BUFFERS[st.c_rbuf[i]], int(st.c_rlo[i]), int(st.c_rhi[i]))
            ops[r].append(Copy(Slice(BUFFERS[st.c_sbuf[i]], int(st.c_slo[i]), int(st.c_shi[i])),
                               Slice(BUFFERS[st.c_dbuf[i]], int(st.c_dlo[i]), int(st.c_dhi[i])), int(st.c_bytes[i]), rw))
        for i in range(len(st.g_rank)):
            ops[int(st.g_rank[i])].append(Stage(int(st.g_bytes[i]), "in" if st.g_dir[i] == 0 else "out"))
        for r in range(p):
            if ops[r]:
                out[r].append(tuple(ops[r]))
    return [tuple(s) for s in out]


def rank_step_indices(program: list, rank: int) -> list:
    """The indices of the global steps in which `rank` has an op: its steps, as `rank_steps`
    lists them (step k of the rank is global step rank_step_indices(...)[k])."""
    out = []
    for i, st in enumerate(program):
        st = st.full()
        if (rank == st.t_src).any() or (rank == st.t_dst).any() or (rank == st.c_rank).any() \
                or (rank == st.g_rank).any():
            out.append(i)
    return out


def data_moves(program: list) -> list:
    """The serial data program: per step, its copies then its transfers, as plain tuples.

    Valid because a rank never writes, within a step, a slice that the step exposes to a peer
    (`hazards` checks it), and copies run at the start of their step in every engine.
    """
    moves = []
    for st in program:
        st = st.full()
        for i in range(len(st.c_rank)):
            r = int(st.c_rank[i])
            moves.append((r, int(st.c_sbuf[i]), int(st.c_slo[i]), int(st.c_shi[i]),
                          r, int(st.c_dbuf[i]), int(st.c_dlo[i]), int(st.c_dhi[i]),
                          int(st.c_rbuf[i]), int(st.c_rlo[i]), int(st.c_rhi[i])))
        for i in range(len(st.t_src)):
            moves.append((int(st.t_src[i]), int(st.t_sbuf[i]), int(st.t_slo[i]), int(st.t_shi[i]),
                          int(st.t_dst[i]), int(st.t_dbuf[i]), int(st.t_dlo[i]), int(st.t_dhi[i]),
                          int(st.t_rbuf[i]), int(st.t_rlo[i]), int(st.t_rhi[i])))
    return moves


def moves_for(moves: list, rank: int, buf: int) -> list:
    """The moves that decide what `rank`'s buffer `buf` holds at the end (a backward slice of the
    serial program): a rank that needs only its own result runs these. Exact: a kept move runs
    with every move it depends on, in the original order; a position a plain copy overwrites is
    dead before that copy, so what fed it earlier is dropped."""
    extent = {}
    for s, sb, sl, sh, d, db, dl, dh, rb, rl, rh in moves:
        for key, hi in (((s, sb), sh), ((d, db), dh)) + ((((d, rb), rh),) if rb >= 0 else ()):
            extent[key] = max(extent.get(key, 0), hi)
    live = {key: np.zeros(n, dtype=bool) for key, n in extent.items()}
    if (rank, buf) not in live:
        return []
    live[(rank, buf)][:] = True
    keep = []
    for m in reversed(moves):
        s, sb, sl, sh, d, db, dl, dh, rb, rl, rh = m
        seg = live[(d, db)][dl:dh]
        if not seg.any():
            continue
        keep.append(m)
        need = seg.copy()
        seg[:] = False                      # overwritten here: dead before, unless read below
        live[(s, sb)][sl:sh] |= need
        if rb >= 0:
            live[(d, rb)][rl:rh] |= need
    return keep[::-1]


def index_aligned(moves: list) -> bool:
    """True when every move pairs equal index ranges, so disjoint index ranges can run on
    different threads (vector collectives); block collectives split by column instead."""
    return all(m[2] == m[6] and m[3] == m[7] and (m[8] < 0 or (m[9], m[10]) == (m[6], m[7])) for m in moves)


def execute(moves: list, buffers: list, reduce_fn, lo: int | None = None, hi: int | None = None) -> None:
    """Run data moves on every rank's buffers (`buffers[rank][buffer code]`), optionally only on
    first-axis indices [lo, hi) (valid for index-aligned moves)."""
    copyto = np.copyto
    if lo is None:
        for s, sb, sl, sh, d, db, dl, dh, rb, rl, rh in moves:
            out = buffers[d][db][dl:dh]
            if rb < 0:
                copyto(out, buffers[s][sb][sl:sh])
            else:
                reduce_fn(buffers[s][sb][sl:sh], buffers[d][rb][rl:rh], out)
        return
    for s, sb, sl, sh, d, db, dl, dh, rb, rl, rh in moves:
        a = dl if dl > lo else lo
        b = dh if dh < hi else hi
        if a >= b:
            continue
        out = buffers[d][db][a:b]
        if rb < 0:
            copyto(out, buffers[s][sb][a:b])
        else:
            reduce_fn(buffers[s][sb][a:b], buffers[d][rb][a:b], out)


def hazards(program: list) -> list:
    """Zero-copy violations: a rank writing, in a step, a slice the step exposes to a peer."""
    found = []
    for t, st in enumerate(program):
        st = st.full()
        exposed = {}
        for i in range(len(st.t_src)):
            exposed.setdefault(int(st.t_src[i]), []).append((int(st.t_sbuf[i]), int(st.t_slo[i]), int(st.t_shi[i])))
        writes = [(int(st.t_dst[i]), int(st.t_dbuf[i]), int(st.t_dlo[i]), int(st.t_dhi[i])) for i in range(len(st.t_src))]
        writes += [(int(st.c_rank[i]), int(st.c_dbuf[i]), int(st.c_dlo[i]), int(st.c_dhi[i])) for i in range(len(st.c_rank))]
        for r, b, lo, hi in writes:
            for eb, elo, ehi in exposed.get(r, ()):
                if eb == b and lo < ehi and elo < hi and lo < hi and elo < ehi:
                    found.append((t, r, BUFFERS[b], (lo, hi), (elo, ehi)))
    return found
