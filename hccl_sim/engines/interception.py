"""What stands around every run while a chaos session is on: `hccl_sim.run` and `Cluster.run` hand
their run to the installed interceptor (hccl_sim.testing's, while a fault suite runs a test)
instead of launching it themselves, so a test's own calls meet the scenario's faults and are
recorded, with nothing in the test changed. With none installed (always, outside such a test) a
run launches as it is.

The interceptor gets a `Run`: the user's function and arguments, its topology, the fault plan the
caller gave (or None), how to make the run's configuration for a plan (`config_for`) and how to
launch a function with a configuration on the run's engine (`launch`), and what ends a run that
will not (`abandon`, a Ray cluster's close). This module knows nothing of what it does with them.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

_lock = threading.Lock()
_interceptor = None


@dataclass(frozen=True)
class Run:
    """One run as its caller made it."""
    fn: Callable
    args: tuple
    kwargs: dict
    topology: Any
    engine: str
    faults: Any                                   # the caller's FaultPlan, or None
    config_for: Callable[[Any], Any]              # FaultPlan or None -> the run's Config
    launch: Callable[[Callable, Any], list]       # (fn, Config) -> results by rank (raises as a run does)
    abandon: Optional[Callable[[], None]] = None  # ends a run the caller will not wait for (None: threads)


def install(interceptor) -> None:
    """Put `interceptor` (an object with `run(Run) -> results`) around every run from now on; one
    at a time."""
    global _interceptor
    with _lock:
        if _interceptor is not None and interceptor is not None:
            from topologies.errors import HcclError
            raise HcclError("E_IN_STATUS", "a chaos session is already running here (one test at a time)")
        _interceptor = interceptor


def current():
    """The installed interceptor, or None."""
    return _interceptor
