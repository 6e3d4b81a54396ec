"""Lowering: a collective's plan (planner.OpPlan) to the self-contained DataProgram that byte
movers run (hcomm.exec).

What the collective is decides the buffer layout and the scratch area (hccl_sim.collectives);
the plan holds the loops and their programs; the signature holds the reduction. After lowering,
execution needs nothing of the collective layer.
"""
from __future__ import annotations

from hcomm.exec import DataLoop, DataProgram, LoopBody

from ..config.types import parse_reduce_op, reduce_ufunc


def lower(plan) -> DataProgram:
    """The DataProgram of `plan` (build it once per plan: OpPlan.data)."""
    sig, coll = plan.signature, plan.collective
    p = len(plan.entry)
    loops = tuple(DataLoop(a, b, LoopBody.of(program)) for (a, b), program in plan.loop_programs())
    ufunc = reduce_ufunc(parse_reduce_op(sig.redop)) if sig.redop is not None else None
    return DataProgram(coll.method, p, loops, coll.layout(p), coll.scratch_shape(p, plan.loops), ufunc,
                       coll.carries_data)
