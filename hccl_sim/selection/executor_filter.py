"""Which of a device's algorithms an executor-grammar HCCL_ALGO leaves selectable.

The open-source HCCL's A5 selector (hicann/hccl `alg_parse.cc` UpdateCostModelWithAlgo,
docs/references.md §7.7) names every algorithm `<Engine><Op><Executor><Template>...`
(`CcuMSAllReduceSequenceMesh2DieNHR`) and keeps a count per name; a count of 0 removes it from the
cost model's choice. The parsed entries (`config.alg_parse`) act on the counts:

1. names of engines outside the candidates are removed (never a send or receive);
2. the entries apply from the last to the first; an op an entry has matched is settled, and a
   global entry applies to every op not yet settled;
3. `not(exec{...})` removes that one algorithm (or, with `{}`, every one of that executor) and
   settles the op; a wanted entry that matches keeps what it matches and removes the op's others;
   a template under `not(...)` matches any other template at its level; a wanted entry that
   matches nothing changes nothing.

`filter_counts` is that function over a {name: count} table, reproduced against HCCL's own unit
tests (tests/test_alg_parse.py).
"""
from __future__ import annotations

from topologies.errors import HcclError

from ..config.alg_parse import ALGO_TYPES, ENGINE_TYPES, EXECUTOR_TYPES, OP_TYPES

_FRAGMENTS = sorted(set(ALGO_TYPES.values()), key=len, reverse=True)    # longest first: Mesh2Die before Mesh
_EXECUTORS = tuple(EXECUTOR_TYPES.values())
_POINT_TO_POINT = ("send", "recv")      # HCCL leaves any algorithm whose name holds one of these alone


def _point_to_point(name: str) -> bool:
    low = name.lower()
    return any(mark in low for mark in _POINT_TO_POINT)


def _levels(rest: str):
    """`rest` cut into template fragments greedily, longest first; None if it does not cut."""
    out = []
    while rest:
        fragment = next((f for f in _FRAGMENTS if rest.startswith(f)), None)
        if fragment is None:
            return None
        out.append(fragment)
        rest = rest[len(fragment):]
    return out


def _matches_pattern(name: str, prefix: str, templates) -> bool:
    """A wanted entry with a negated template: same prefix, as many levels, each wanted level that
    template and each negated level some other one."""
    if not name.startswith(prefix):
        return False
    levels = _levels(name[len(prefix):])
    if levels is None or len(levels) != len(templates):
        return False
    return all((got == ALGO_TYPES[t.name]) == t.enabled for got, t in zip(levels, templates))


def _of_op(name: str, op: str) -> bool:
    """Whether `name` is an algorithm of op `op` (an engine, the op, then an executor)."""
    for engine in ENGINE_TYPES.values():
        head = engine + op
        if name.startswith(head) and name[len(head):].startswith(_EXECUTORS):
            return True
    return False


def filter_counts(entries, counts: dict, engines) -> dict:
    """`counts` ({algorithm name: count}) after the parsed HCCL_ALGO `entries`, with `engines`
    (fragments such as "Aicpu", "CcuMS") the candidate engines. A new dict; E_PARA for no engines."""
    engines = list(engines)
    if not engines:
        raise HcclError("E_PARA", "HCCL_ALGO's filter needs at least one candidate engine")
    out = {name: (count if name.startswith(tuple(engines)) or _point_to_point(name) else 0)
           for name, count in counts.items()}
    settled = set()
    for entry in reversed(entries):
        ops = [OP_TYPES[entry.op]] if entry.op else [o for o in OP_TYPES.values() if o not in settled]
        for op in ops:
            if op in settled:
                continue
            if _apply(entry, op, engines, out):
                settled.add(op)
        if len(settled) == len(OP_TYPES):
            break
    return out


def hits(entry, op: str, engines, counts: dict) -> list:
    """The algorithms of op `op` (its fragment, "AllReduce") in `counts` that `entry` names, by
    HCCL's match modes: the one exact name, every name of its executor (`{}`), or the pattern of
    a negated template."""
    executor = EXECUTOR_TYPES[entry.executor]
    exact_tail = "".join(ALGO_TYPES[t.name] for t in entry.templates)
    negated_level = any(not t.enabled for t in entry.templates)
    found = []
    for engine in engines:
        prefix = engine + op + executor
        if not entry.enabled:
            found += [n for n in counts if n.startswith(prefix)] if not entry.templates else \
                [n for n in (prefix + exact_tail,) if n in counts]
        elif negated_level:
            found += [n for n in counts if _matches_pattern(n, prefix, entry.templates)]
        elif not entry.templates:
            found += [n for n in counts if n.startswith(prefix) and counts[n] != 0]
        else:
            found += [n for n in (prefix + exact_tail,) if n in counts]
    return found


def _apply(entry, op: str, engines, out: dict) -> bool:
    """One entry on one op's algorithms in `out`; whether it settled the op."""
    found = hits(entry, op, engines, out)
    if not found:
        return False
    if not entry.enabled:
        for name in found:
            out[name] = 0
        return True
    kept = set(found)
    for name in out:
        if name not in kept and _of_op(name, op) and not _point_to_point(name):
            out[name] = 0
    return True
