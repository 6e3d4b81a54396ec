"""A rank's steps in the form the per-rank executor runs (hcomm.exec.per_rank).

Each step is (sends, copies, recvs, fence), in issue order:
- sends: (peer, buf, start, stop), a slice of this rank's buffer `buf` exposed to `peer`;
- copies: (src buf, start, stop, dst buf, start, stop, operand buf or None, start, stop): dst = src,
  or a local reduce, dst = src (op) the operand slice;
- recvs: (peer, dst buf, start, stop, operand buf or None, start, stop): dst = the peer's data, or
  the peer's data (op) the operand slice;
- fence: before this step's copies and receives, the sends of this rank's steps before step
  `fence` must have been consumed.

The fence is what lets a rank move on without waiting, at the end of every step, for the
receivers of its sends. A slice a rank has exposed must not be written until it is consumed
(zero copy), and only a later write to it has to wait: a step's fence is one past the last
earlier step whose sends overlap what the step writes (by each buffer's extent of the two, a
conservative test), and the executor waits for every send at the end of the schedule. In a
pairwise AlltoAll, whose sends read the input and whose receives write the output, no step waits
at all, where waiting at every step's end cost each rank a sleep and a wake-up per step.

Everything is plain tuples of names and ints, not hcomm.steps' named tuples: a large op's
schedules hold hundreds of thousands of ops for as long as its program is cached, and plain tuples
of atoms are the one kind of object Python's cycle collector stops tracking (named tuples made
every full collection scan them all: a quarter of a 256-rank AlltoAll's time).
"""
from __future__ import annotations

from ..program import BUFFERS
from ..steps import Copy, Recv, Send

_TRANSFER_ARRAYS = ("t_src", "t_dst", "t_sbuf", "t_slo", "t_shi", "t_dbuf", "t_dlo", "t_dhi", "t_rbuf", "t_rlo", "t_rhi")
_COPY_ARRAYS = ("c_rank", "c_sbuf", "c_slo", "c_shi", "c_dbuf", "c_dlo", "c_dhi", "c_rbuf", "c_rlo", "c_rhi")


def rank_schedules(program: list, p: int) -> list:
    """Every rank's steps of `program` (a list of hcomm.program global steps), a step wherever the
    rank has an op, as `hcomm.program.rank_steps` lists them (a staging copy included: a crash's
    step count counts it)."""
    out = [[] for _ in range(p)]
    for st in program:
        st = st.full()
        parts = {}
        for s, d, sb, slo, shi, db, dlo, dhi, rb, rlo, rhi in zip(*(getattr(st, a).tolist() for a in _TRANSFER_ARRAYS)):
            parts.setdefault(s, ([], [], []))[0].append((d, BUFFERS[sb], slo, shi))
            operand = None if rb < 0 else BUFFERS[rb]
            parts.setdefault(d, ([], [], []))[2].append((s, BUFFERS[db], dlo, dhi, operand, rlo, rhi))
        for r, sb, slo, shi, db, dlo, dhi, rb, rlo, rhi in zip(*(getattr(st, a).tolist() for a in _COPY_ARRAYS)):
            operand = None if rb < 0 else BUFFERS[rb]
            parts.setdefault(r, ([], [], []))[1].append((BUFFERS[sb], slo, shi, BUFFERS[db], dlo, dhi, operand, rlo, rhi))
        for r in st.g_rank.tolist():
            parts.setdefault(r, ([], [], []))
        for r, (sends, copies, recvs) in parts.items():
            out[r].append((tuple(sends), tuple(copies), tuple(recvs)))
    return [with_fences(steps) for steps in out]


def from_steps(schedule) -> tuple:
    """One rank's schedule of hcomm.steps ops (lists of Send, Recv, Copy, Stage) in this form."""
    steps = []
    for step in schedule:
        sends = tuple((i.peer,) + tuple(i.src) for i in step if type(i) is Send)
        copies = tuple(tuple(i.src) + tuple(i.dst) + ((None, 0, 0) if i.reduce_with is None else tuple(i.reduce_with))
                       for i in step if type(i) is Copy)
        recvs = tuple((i.peer,) + tuple(i.dst) + ((None, 0, 0) if i.reduce_with is None else tuple(i.reduce_with))
                      for i in step if type(i) is Recv)
        steps.append((sends, copies, recvs))
    return with_fences(steps)


def with_fences(steps) -> tuple:
    """(sends, copies, recvs) steps with each one's fence (see the module docstring)."""
    out, sent, fence = [], [], 0
    for k, (sends, copies, recvs) in enumerate(steps):
        writes = _extents([c[3:6] for c in copies] + [r[1:4] for r in recvs])
        for j in range(k - 1, fence - 1, -1):
            if _overlap(sent[j], writes):
                fence = j + 1
                break
        out.append((sends, copies, recvs, fence))
        sent.append(_extents([s[1:4] for s in sends]))
    return tuple(out)


def _extents(slices) -> dict:
    """buf -> (lowest start, highest stop) of the non-empty slices (buf, start, stop)."""
    got = {}
    for buf, start, stop in slices:
        if start < stop:
            lo, hi = got.get(buf, (start, stop))
            got[buf] = (min(lo, start), max(hi, stop))
    return got


def _overlap(a: dict, b: dict) -> bool:
    return any(buf in b and lo < b[buf][1] and b[buf][0] < hi for buf, (lo, hi) in a.items())
