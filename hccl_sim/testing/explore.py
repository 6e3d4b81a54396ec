"""A fault suite of one test: its fault-free twin, N seeded scenarios aimed at what the twin did,
the first failure shrunk to the smallest plan that still fails, and a token that replays it.

`explore(body, ...)` is the library form of `pytest --hccl-chaos N`: `body` is the test, a
function of no arguments that makes its hccl_sim runs as it always does (hccl_sim.run,
Cluster.run). Each execution of it runs inside a recording session (hccl_sim.testing.recording),
which applies the scenario's plan to the runs and keeps every rank's outcome; the verdict
(hccl_sim.testing.verdict) compares them with the twin's; what the execution left behind
(shared memory, processes, threads: hccl_sim.chaos.runners' snapshots) is a LEAK. Hypothesis
draws the plans (hccl_sim.testing.scenarios) from the seed and, on a failure, shrinks it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from topologies.errors import HcclError

from ..chaos.check import OUTCOMES, Verdict
from ..chaos.runners import leaks, snapshot
from ..chaos.scenarios import quiet_logs
from ..faults.fault_plan import FaultPlan
from . import token as tokens
from .recording import Session
from .scenarios import Facts, check_kinds, describe, facts_of, plans
from .verdict import DEFAULT_ALLOW, FAILING, judge


@dataclass
class Scenario:
    """One execution of the test under a plan, and its outcome."""
    plan: FaultPlan
    verdict: Verdict
    wall_s: float
    words: str = ""                     # the plan in a few words

    @property
    def outcome(self) -> str:
        return self.verdict.outcome

    def to_dict(self) -> dict:
        return {"outcome": self.outcome, "detail": self.verdict.detail, "plan": self.plan.to_dict(),
                "fault": self.words, "wall_s": round(self.wall_s, 4)}


@dataclass
class Report:
    """A test's fault suite: the scenarios drawn (in order), its first failure, that failure
    shrunk, the shrinking's cost and the replay token of the shrunk plan."""
    name: str
    seed: int
    asked: int                           # scenarios asked for
    scenarios: list = field(default_factory=list)
    failure: Optional[Scenario] = None
    shrunk: Optional[Scenario] = None
    shrink_runs: int = 0
    shrink_s: float = 0.0
    token: Optional[str] = None
    twin_s: float = 0.0
    wall_s: float = 0.0

    def counts(self) -> dict:
        return {o: sum(1 for s in self.scenarios if s.outcome == o) for o in OUTCOMES}

    @property
    def failed(self) -> bool:
        return self.failure is not None

    def summary(self) -> str:
        c = self.counts()
        ran = len(self.scenarios)
        head = f"{ran} scenarios" if ran == self.asked else f"{ran} of {self.asked} scenarios"
        return (f"hccl-chaos {self.name}: {head}: {c['recovered']} recovered, {c['clean error']} clean error, "
                f"{c['WRONG']} WRONG, {c['HANG']} HANG, {c['LEAK']} LEAK, {c['skipped']} skipped")

    def to_dict(self) -> dict:
        failures = []
        if self.failure is not None:
            shrunk = self.shrunk or self.failure
            failures.append({"outcome": self.failure.outcome, "detail": self.failure.verdict.detail,
                             "plan": self.failure.plan.to_dict(), "shrunk": shrunk.plan.to_dict(),
                             "shrunk_outcome": shrunk.outcome, "shrunk_detail": shrunk.verdict.detail,
                             "replay": self.token, "shrink_runs": self.shrink_runs})
        return {"nodeid": self.name, "seed": self.seed, "scenarios": [s.to_dict() for s in self.scenarios],
                "failures": failures, "counts": self.counts(), "wall_s": round(self.wall_s, 3)}


class _Failed(Exception):
    """Raised inside Hypothesis's test for a failing scenario, so that it shrinks."""


class Suite:
    """The executions of one test: its twin first, then any plan's (`run(plan)`)."""

    def __init__(self, body: Callable[[], object], allow=DEFAULT_ALLOW, check=None, deadline_s: float = 60.0):
        self.body, self.allow, self.check, self.deadline_s = body, tuple(allow), check, deadline_s
        self.twin = None
        self.facts: Optional[Facts] = None

    def run_twin(self, kinds=None) -> float:
        """The fault-free run; raises what the test raised when it fails without faults."""
        t0 = time.perf_counter()
        runs, raised, _ = self._execute(None, None)
        if raised is not None:
            raise raised
        self.twin = runs
        self.facts = facts_of(runs, check_kinds(kinds))
        return time.perf_counter() - t0

    def run(self, plan: FaultPlan) -> Scenario:
        t0 = time.perf_counter()
        runs, raised, left = self._execute(plan, self.facts.fingerprint)
        verdict = judge(self.twin, runs, self.allow, self.check, raised)
        if left:
            detail = f"left behind: {', '.join(left[:4])}" + (" ..." if len(left) > 4 else "")
            if verdict.outcome in FAILING:
                verdict.detail += f"; also {detail}"
            else:
                verdict = Verdict("LEAK", detail)
        return Scenario(plan, verdict, time.perf_counter() - t0, describe(plan, self.facts.topology))

    def _execute(self, plan, drawn_for):
        before = snapshot()
        session = Session(plan, drawn_for, self.deadline_s)
        raised = None
        with quiet_logs(), session:
            try:
                self.body()
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:   # noqa: BLE001 - the test's end under the plan, judged
                raised = exc
        return session.runs, raised, leaks(before)


def explore(body: Callable[[], object], name: str = "test", n: int = 100, seed: int = 0, kinds=None,
            max_faults: int = 2, allow=DEFAULT_ALLOW, check=None, deadline_s: float = 60.0,
            shrink: bool = True) -> Report:
    """`body` under its twin and `n` scenarios of `seed`; the first failure shrunk (see the module)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise HcclError("E_PARA", f"the number of scenarios must be a positive integer, got {n!r}")
    if isinstance(max_faults, bool) or not isinstance(max_faults, int) or max_faults < 1:
        raise HcclError("E_PARA", f"max_faults must be a positive integer, got {max_faults!r}")
    t0 = time.perf_counter()
    suite = Suite(body, allow, check, deadline_s)
    report = Report(name, seed, n)
    report.twin_s = suite.run_twin(kinds)
    _search(suite, report, plans(suite.facts, max_faults), n, seed, shrink)
    if report.failure is not None:
        report.token = tokens.encode(name, (report.shrunk or report.failure).plan)
    report.wall_s = time.perf_counter() - t0
    return report


def _search(suite, report, strategy, n, seed, shrink):
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as seeded
    state = {"shrinking": False, "t": 0.0}

    @settings(max_examples=n, database=None, deadline=None, derandomize=False, report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, print_blob=False,
              phases=(Phase.generate, Phase.shrink) if shrink else (Phase.generate,))
    @seeded(seed)
    @given(strategy)
    def one(plan):
        result = suite.run(plan)
        if state["shrinking"]:
            report.shrink_runs += 1
            if result.outcome in FAILING:
                report.shrunk = result
        else:
            report.scenarios.append(result)
            if result.outcome in FAILING:
                report.failure, state["shrinking"], state["t"] = result, True, time.perf_counter()
        if result.outcome in FAILING:
            raise _Failed(result.verdict.detail)
    try:
        one()
    except _Failed:
        pass
    if state["shrinking"]:
        if report.shrunk is None:
            report.shrunk = report.failure
        if shrink:
            _drop_entries(suite, report)
        report.shrink_s = time.perf_counter() - state["t"]


def _drop_entries(suite, report):
    """Hypothesis's shrinking can keep an entry whose removal would change how the rest are drawn;
    try the plan without each entry in turn, and keep every removal that still fails."""
    plan = report.shrunk.plan
    i = 0
    while len(plan.entries) > 1 and i < len(plan.entries):
        fewer = FaultPlan.from_dict({"seed": plan.seed, "faults": [dict(e) for k, e in enumerate(plan.entries)
                                                                   if k != i]})
        result = suite.run(fewer)
        report.shrink_runs += 1
        if result.outcome in FAILING:
            report.shrunk, plan = result, fewer
        else:
            i += 1


def replay(body: Callable[[], object], token: str, name: str = "test", allow=DEFAULT_ALLOW, check=None,
           deadline_s: float = 60.0) -> Scenario:
    """The scenario of `token` (made for the test `name`) on `body`: its twin, then the plan."""
    plan = tokens.decode(token, name)
    suite = Suite(body, allow, check, deadline_s)
    suite.run_twin()
    return suite.run(plan)
