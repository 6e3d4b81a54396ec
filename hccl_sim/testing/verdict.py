"""A scenario's outcome: every run of the test under the plan against the same run of its
fault-free twin, and the test's own end (docs/design.md, "Fault suites").

Per run, from every rank's RankOutcome (hccl_sim.testing.recording):
- recovered: no rank died that the plan does not crash, and every survivor returned a result the
  twin's equals (`same`: arrays bit for bit, torch tensors by their values, containers element by
  element; an OpRecord is timing, not a result, and is not compared), or that the user's
  `check(results, twin_results)` accepts (results by rank, None for a dead rank);
- clean error: every survivor raised, in the same call (as many collectives done), and the run's
  error (the engines' root cause) is one the plan's faults can produce, naming the fault, with a
  code the test allows (hccl_sim.chaos.check.error_problem judges the fields); the others raised
  that one or a consequence of it (a peer that failed, returned or was lost; an abort);
- skipped: the engine refuses the plan (E_NOT_SUPPORT);
- WRONG: anything else; HANG: a run past its wall deadline. LEAK (things left behind) is the
  caller's, from snapshots around the whole test.
A scenario is its worst run's outcome; the test's own end counts too: an exception from the test
that is not the error of a run that ended cleanly (its own assertion failing under the faults) is
WRONG.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np

from topologies.errors import HcclError

from ..chaos.check import CallRecord, Verdict, error_problem, short
from ..comm.record import OpRecord
from ..engines.rendezvous import is_consequence, root_cause
from ..faults.fault_plan import STOPPING
from .recording import ScenarioHang

DEFAULT_ALLOW = ("E_REMOTE", "E_TIMEOUT", "E_OPRETRY_FAIL", "E_MEMORY")
"""Error codes a clean error may have unless the test says otherwise: an error CQE (a link down
past its retransmissions, op retry off), a lost rank or a timed-out wait, op retry refused, an
HBM allocation or link setup an hbm_pressure starved. Each is clean only where it names an entry
of the plan that makes it (chaos.check.error_problem): an E_MEMORY no hbm_pressure entry names
(the test's own memory running out) stays WRONG."""
FAILING = ("WRONG", "HANG", "LEAK")
RANKING = ("recovered", "skipped", "clean error", "WRONG", "HANG", "LEAK")


def same(a, b, path: str = "result") -> Optional[str]:
    """None if `a` equals `b` as results do (see the module's doc), else where they differ."""
    if isinstance(a, OpRecord) and isinstance(b, OpRecord):
        return None
    a, b = _plain(a), _plain(b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return f"{path}: {type(a).__name__} against the twin's {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{path}: {a.dtype}{list(a.shape)} against the twin's {b.dtype}{list(b.shape)}"
        ea = np.ascontiguousarray(a).reshape(-1).view(np.uint8).reshape(a.size, -1)
        eb = np.ascontiguousarray(b).reshape(-1).view(np.uint8).reshape(b.size, -1)
        differ = np.flatnonzero((ea != eb).any(axis=1))
        if differ.size:
            k = int(differ[0])
            return f"{path}: element {k} is {a.reshape(-1)[k].tolist()!r}, the twin's {b.reshape(-1)[k].tolist()!r}"
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: {len(a)} items against the twin's {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            problem = same(x, y, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{path}: keys {sorted(map(str, a))[:6]} against the twin's {sorted(map(str, b))[:6]}"
        for k in a:
            problem = same(a[k], b[k], f"{path}[{k!r}]")
            if problem:
                return problem
        return None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    try:
        equal = a == b
        equal = bool(equal)
    except Exception:      # noqa: BLE001 - an object without a truth value for ==
        equal = a is b
    return None if equal else f"{path}: {short(repr(a), 80)}, the twin's {short(repr(b), 80)}"


def _plain(x):
    """A torch tensor as a numpy array (its values); anything else as it is."""
    if type(x).__module__.startswith("torch"):
        import torch
        if isinstance(x, torch.Tensor):
            return x.detach().cpu().numpy()
    return x


def judge_run(twin, run, allow, check: Optional[Callable] = None) -> Verdict:
    """The outcome of one run under faults (`run`, a RunRecord) against the twin's (None: the
    twin made no such run, so only its errors are judged)."""
    if run.status == "hang":
        return Verdict("HANG", "a run did not end by its wall deadline")
    if run.status == "raised":
        exc = run.raised
        if isinstance(exc, HcclError) and exc.code == "E_NOT_SUPPORT":
            return Verdict("skipped", short(str(exc)))
        return Verdict("WRONG", f"the run was refused: {short(f'{type(exc).__name__}: {exc}')}")
    outcomes, entries = run.outcomes, run.plan.entries if run.plan is not None else []
    crashing = {e["rank"] for e in entries if e["kind"] in STOPPING}
    dead = [r for r, o in enumerate(outcomes) if o is None]
    if set(dead) - crashing:
        return Verdict("WRONG", f"rank {min(set(dead) - crashing)} returned no result, but the plan does not crash it")
    survivors = [r for r, o in enumerate(outcomes) if o is not None]
    if not survivors:
        return Verdict("WRONG", "every rank died")
    failed = [r for r in survivors if not outcomes[r].ok]
    if not failed:
        return _results(twin, run, dead, check)
    if len(failed) < len(survivors):
        done = [r for r in survivors if r not in failed]
        return Verdict("WRONG", f"ranks disagree: ranks {done[:6]} completed, ranks {failed[:6]} raised "
                                f"({short(str(outcomes[failed[0]].error), 160)})")
    foreign = [r for r in failed if outcomes[r].foreign]
    if foreign:
        return Verdict("WRONG", f"rank {foreign[0]} raised {short(str(outcomes[foreign[0]].error), 240)}")
    where = {r: sum(1 for op in outcomes[r].log if op.seq is not None) for r in failed}
    if len(set(where.values())) > 1:
        return Verdict("WRONG", "ranks failed in different calls: " + ", ".join(
            f"rank {r} after {k} collectives" for r, k in sorted(where.items())[:6]))
    errors = {r: outcomes[r].error for r in failed}
    if {e.code for e in errors.values()} == {"E_NOT_SUPPORT"}:
        return Verdict("skipped", short(str(errors[failed[0]])))
    # the engines' rule with simulated time for wall time, so that the verdict is the same every run
    rank, root, _ = root_cause([(r, errors[r], errors[r].time_ns or 0) for r in failed])
    if root.code not in allow:
        return Verdict("WRONG", f"rank {rank} raised {root.code}, which the test does not allow "
                                f"(allow={list(allow)}): {short(str(root))}")
    for r in failed:
        exc = errors[r]
        if r != rank and is_consequence(exc):
            continue                # told of the root cause's rank: that one is judged
        problem = error_problem(entries, r, _as_record(exc, outcomes[r]), run.config, dead)
        if problem:
            return Verdict("WRONG", problem)
    return Verdict("clean error", short(str(root)))


def _as_record(exc: HcclError, outcome) -> CallRecord:
    """A rank's error as chaos's checker reads it: its code, message, fields and the clock it was
    found at (the error's time, else the end of the rank's last op)."""
    end = exc.time_ns if exc.time_ns is not None else (outcome.log[-1].record.end if outcome.log else 0)
    return CallRecord(False, None, 0, end, code=exc.code, message=str(exc), error=exc.fields())


def _results(twin, run, dead, check) -> Verdict:
    if twin is None or twin.outcomes is None:
        return Verdict("recovered", "no twin run to compare with")
    mine = [None if o is None else o.value for o in run.outcomes]
    theirs = [None if o is None else o.value for o in twin.outcomes]
    if check is not None:
        try:
            accepted = check(mine, theirs)
        except AssertionError as exc:
            return Verdict("WRONG", f"the test's check rejected the results: {short(str(exc) or 'AssertionError')}")
        if accepted is False:
            return Verdict("WRONG", "the test's check rejected the results (it returned False)")
        return Verdict("recovered")
    if dead:
        return Verdict("WRONG", f"rank {dead[0]} died but every survivor completed (give the marker a check= to "
                                "judge results without the dead ranks)")
    for r, (a, b) in enumerate(zip(mine, theirs)):
        problem = same(a, b, f"rank {r}'s result")
        if problem:
            return Verdict("WRONG", f"{problem} (the fault-free twin's)")
    return Verdict("recovered")


def judge(twin_runs, runs, allow=DEFAULT_ALLOW, check=None, raised: Optional[BaseException] = None) -> Verdict:
    """The scenario's outcome: its worst run's, then the test's own end (`raised`: what the test
    raised, None if it passed)."""
    verdicts = [judge_run(twin_runs[i] if i < len(twin_runs) else None, run, allow, check)
                for i, run in enumerate(runs)]
    worst = max(verdicts, key=lambda v: RANKING.index(v.outcome)) if verdicts else None
    if worst is not None and worst.outcome in FAILING:
        return worst
    if isinstance(raised, ScenarioHang):
        return Verdict("HANG", str(raised))
    if raised is not None:
        ended = [run for run in runs if run.status == "done" and run.outcomes is not None
                 and any(o is not None and not o.ok for o in run.outcomes)]
        if not (isinstance(raised, HcclError) and ended):
            return Verdict("WRONG", f"the test failed under the faults: {short(f'{type(raised).__name__}: {raised}')}")
    if worst is None:
        return Verdict("WRONG", "the test made no hccl_sim run under the scenario")
    return worst
