"""Seeded fault campaigns: `hccl-sim chaos -n 500 --seed 7` (docs/design.md, "Faults contract").

scenarios.py  what a scenario is (Call, Scenario) and how scenarios are drawn (generate, scenario)
check.py      what every rank runs (rank_program) and what the outcome is (classify)
runners.py    running one against its fault-free twin on an engine (run_scenario), HANG and LEAK
report.py     the campaign (run_campaign), its table, summary, JSON and one scenario in full
"""
from .check import FAILURES, OUTCOMES, CallRecord, Result, Verdict, classify, rank_program
from .report import run_campaign
from .runners import run_scenario
from .scenarios import Call, Scenario, generate, scenario, space_for

__all__ = ["Call", "Scenario", "generate", "scenario", "space_for", "run_scenario", "classify", "run_campaign",
           "rank_program", "CallRecord", "Result", "Verdict", "OUTCOMES", "FAILURES"]
