"""Lowering: a collective's plan (planner.OpPlan) to the self-contained DataProgram that byte
movers run (hcomm.exec).

What the collective is decides the buffer layout, each loop's view of the buffers and the scratch
area (hccl_sim.collectives: `Collective.data_loops`); the plan holds the loops and their programs;
the signature holds the reduction. After lowering, execution needs nothing of the collective layer.
"""
from __future__ import annotations

from hcomm.exec import DataLoop, DataProgram, LoopBody

from ..config.types import parse_reduce_op, reduce_ufunc


def lower(plan) -> DataProgram:
    """The DataProgram of `plan` (build it once per plan: OpPlan.data)."""
    sig, coll = plan.signature, plan.collective
    p = len(plan.entry)
    ufunc = reduce_ufunc(parse_reduce_op(sig.redop)) if sig.redop is not None else None
    spans, scratch = coll.data_loops(sig, p, plan.loops, plan.loop_programs())
    loops = tuple(DataLoop(a, b, LoopBody.of(program)) for a, b, program in spans)
    return DataProgram(coll.method, p, loops, coll.layout(p), scratch, ufunc, coll.carries_data)
