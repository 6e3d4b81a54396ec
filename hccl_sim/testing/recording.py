"""Recording a test's runs: the interceptor a fault suite installs (hccl_sim.engines.interception)
while it runs a test, once fault-free (the twin) and once per scenario.

Every `hccl_sim.run` / `Cluster.run` inside the test then runs the user's function wrapped
(`Recorded`): the rank's op log is kept (comm.op_log: every op, its communicator, number and
simulated times) and its end is kept as data, a value or the exception it raised
(`RankOutcome`), so the verdict sees every rank and not only the run's root cause. The run
itself behaves for the test as it always does: the results by rank, or the run's error (the
engines' root cause of the ranks' errors). A scenario's fault plan is put in front of the plan
the test gave the run, if any, on runs of the topology it was drawn for; each run has a wall
deadline (past it: HANG, the run abandoned, `ScenarioHang` raised into the test).
"""
from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

from hcomm.cost import fingerprint
from topologies.errors import HcclError

from ..chaos.runners import bounded
from ..engines import interception
from ..engines.rendezvous import root_cause
from ..faults.fault_plan import FaultPlan

DEADLINE_MARGIN_S = 15
"""A run's wall deadline is at least HCCL_EXEC_TIMEOUT + this (the engines' own deadline on every
wait must have had its chance before a run counts as hung), as hccl_sim.chaos's."""


class ScenarioHang(BaseException):
    """Raised into a test whose run did not end by its wall deadline: a BaseException, so that the
    test's own `except Exception` cannot take the hang for an error it handles."""


@dataclass
class RankOutcome:
    """How one rank's function ended: its value, or its error (an HcclError; another exception
    is carried as E_INTERNAL naming its type, as the engines report it, with `foreign` its type
    name); its op log; when the error was caught (time.time(), for the root cause)."""
    value: Any = None
    error: Optional[HcclError] = None
    log: list = field(default_factory=list)
    at: float = 0.0
    foreign: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


class Recorded:
    """The user's function as a rank runs it under a fault suite (picklable: Ray's actors get it)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, comm, *args, **kwargs):
        log = comm.op_log = []
        try:
            return RankOutcome(self.fn(comm, *args, **kwargs), None, log)
        except HcclError as exc:
            return RankOutcome(None, exc, log, time.time())
        except Exception as exc:   # noqa: BLE001 - the rank's end, kept as data like an engine's report
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
            err = HcclError("E_INTERNAL", f"{type(exc).__name__}: {exc}\n{text}".rstrip(), rank=comm.rank)
            return RankOutcome(None, err, log, time.time(), foreign=type(exc).__name__)


@dataclass
class RunRecord:
    """One run of the test as the session saw it: where it ran, the plan it met (None:
    fault-free), how it ended ("done", "raised" before any rank ran, "hang"), and every rank's
    outcome (None for a rank the plan crashed)."""
    topology: Any
    engine: str
    plan: Optional[FaultPlan]
    status: str
    config: Any = None
    outcomes: Optional[list] = None
    raised: Optional[BaseException] = None
    wall_s: float = 0.0


def merged(scenario: Optional[FaultPlan], given: Optional[FaultPlan]) -> Optional[FaultPlan]:
    """The scenario's entries first (their labels, "fault plan entry i", stay the drawn plan's),
    then the test's own."""
    if scenario is None or not scenario.entries:
        return given
    if given is None or not given.entries:
        return scenario
    return FaultPlan.from_dict({"seed": scenario.seed, "faults": [dict(e) for e in scenario.entries + given.entries]})


class Session:
    """The interceptor of one execution of a test: fault-free (`plan` None) or under `plan`,
    which applies to runs on a topology with the fingerprint `drawn_for` (None: every run)."""

    def __init__(self, plan: Optional[FaultPlan] = None, drawn_for: Optional[str] = None, deadline_s: float = 60.0):
        self.plan, self.drawn_for, self.deadline_s = plan, drawn_for, deadline_s
        self.runs: list = []

    def __enter__(self):
        interception.install(self)
        return self

    def __exit__(self, *exc):
        interception.install(None)

    def run(self, r: interception.Run):
        applies = self.plan is not None and (self.drawn_for is None or fingerprint(r.topology) == self.drawn_for)
        plan = merged(self.plan, r.faults) if applies else r.faults
        record = RunRecord(r.topology, r.engine, plan if applies else None, "done")
        self.runs.append(record)
        t0 = time.perf_counter()
        try:
            config = r.config_for(plan)
        except HcclError as exc:
            record.status, record.raised = "raised", exc
            raise
        record.config = config
        limit = max(self.deadline_s, (config.exec_timeout_s or 0) + DEADLINE_MARGIN_S)
        status, value = bounded(lambda: r.launch(Recorded(r.fn), config), limit)
        record.wall_s = time.perf_counter() - t0
        if status == "hang":
            record.status = "hang"
            if r.abandon is not None:
                closer = threading.Thread(target=r.abandon, name="hccl-chaos-abandon", daemon=True)
                closer.start()
                closer.join(60)
            raise ScenarioHang(f"a run on {r.engine} did not end within {limit:g} s of wall time")
        if status == "raised":
            record.status, record.raised = "raised", value
            raise value
        record.outcomes = value
        errors = [(rank, o.error, o.at) for rank, o in enumerate(value) if o is not None and not o.ok]
        if errors:
            raise root_cause(errors)[1]
        return [None if o is None else o.value for o in value]
