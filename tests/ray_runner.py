"""A bare rank actor for tests and benchmarks of the Ray object-store transport: it hosts one
endpoint and runs per-rank schedules over it (`ray.remote(num_cpus=0, max_concurrency=4)(ScheduleRunner)`).
Engines mix `RayMailbox` into their own rank actors instead; this one is not part of the library."""
from __future__ import annotations

import time

import numpy as np
import ray

from hcomm.exec import run_schedule as execute
from hcomm.transports.ray_object import RayMailbox, RayObjectTransport


class ScheduleRunner(RayMailbox):
    """A bare rank actor: one endpoint, per-rank schedules run over it."""

    def __init__(self, rank: int, size: int, timeout_s: float | None = None):
        self.rank = rank
        self.hcomm_transport = RayObjectTransport(rank, size, timeout_s)

    def start(self, actors) -> str:
        """Join the peers; returns the id of the Ray node this rank runs on."""
        self.hcomm_transport.start(actors)
        return ray.get_runtime_context().get_node_id()

    def run(self, steps, buffers: dict, tag, reduce_fn, op: str | None = None, repeat: int = 1, keep=("output",)):
        """Register `buffers` (name -> array, or a callable making one here), execute `steps`
        `repeat` times; returns ({name: array for name in keep}, seconds of each repetition)."""
        tr = self.hcomm_transport
        arrays = {name: (b() if callable(b) else np.array(b, copy=True)) for name, b in buffers.items()}
        for name, array in arrays.items():
            tr.register(self.rank, name, array)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            execute(steps, self.rank, tr, tag, reduce_fn, tr.deadline(), op)
            times.append(time.perf_counter() - t0)
        return {name: arrays[name] for name in keep}, times

    def mark_exited(self) -> None:
        self.hcomm_transport.mark_exited(self.rank)

    def abort(self, code: str, reason: str) -> None:
        self.hcomm_transport.abort(code, reason)

    def close(self) -> None:
        self.hcomm_transport.close()
