"""Seeded fault campaigns: `hccl-sim chaos -n 500 --seed 7` (DESIGN.md "Faults contract").

scenarios.py  what a scenario is (Call, Scenario) and how scenarios are drawn (generate, scenario)
check.py      running one against its fault-free twin (run_scenario) and its outcome (classify)
report.py     the campaign (run_campaign), its table, summary, JSON and one scenario in full
"""
from .check import FAILURES, OUTCOMES, CallRecord, Result, Verdict, classify, rank_program, run_scenario
from .report import run_campaign
from .scenarios import Call, Scenario, generate, scenario, space_for

__all__ = ["Call", "Scenario", "generate", "scenario", "space_for", "run_scenario", "classify", "run_campaign",
           "rank_program", "CallRecord", "Result", "Verdict", "OUTCOMES", "FAILURES"]
