"""Fault suites of the user's own code (docs/design.md, "Fault suites"): run a test, or any
function that makes hccl_sim runs, under seeded fault scenarios aimed at what its fault-free twin
did, classify each against the twin, shrink a failure to its smallest plan and replay it from one
token. The pytest plugin (`pytest --hccl-chaos N`, hccl_sim.testing.pytest_plugin) is its usual door.

recording.py    the session around a test's runs: its plan applied, every rank's outcome and op log kept
scenarios.py    the plans Hypothesis draws from the twin's calls, mildest first for shrinking
verdict.py      a scenario's outcome against the twin (recovered, clean error, skipped, WRONG, HANG)
explore.py      twin, N scenarios, the first failure shrunk (explore), one token's scenario (replay)
token.py        replay tokens
pytest_plugin.py  the marker, options, summary lines and JSON report
"""
from .explore import Report, Scenario, explore, replay
from .verdict import DEFAULT_ALLOW, same

__all__ = ["explore", "replay", "Report", "Scenario", "DEFAULT_ALLOW", "same"]
