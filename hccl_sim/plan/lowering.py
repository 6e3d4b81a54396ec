"""Lowering: a collective's plan (planner.OpPlan) to the self-contained DataProgram that byte
movers run (hcomm.exec).

What the collective is decides the buffer layout and the scratch area (hccl_sim.collectives);
the plan holds the loops and their programs; the signature holds the reduction. After lowering,
execution needs nothing of the collective layer.
"""
from __future__ import annotations

import numpy as np

from hcomm.exec import DataLoop, DataProgram, LoopBody
from hcomm.program import SCRATCH

from ..config.types import parse_reduce_op, reduce_ufunc


def lower(plan) -> DataProgram:
    """The DataProgram of `plan` (build it once per plan: OpPlan.data)."""
    sig, coll = plan.signature, plan.collective
    p = len(plan.entry)
    ufunc = reduce_ufunc(parse_reduce_op(sig.redop)) if sig.redop is not None else None
    if coll.variable:
        # programs address whole flat buffers at absolute offsets: every loop's view is all of them,
        # and the scratch area is what the programs address of it
        programs = [program for _, program in plan.loop_programs()]
        scratch = max((_scratch_end(program) for program in programs), default=0)
        whole = max(coll.whole(sig), scratch)
        loops = tuple(DataLoop(0, whole, LoopBody.of(program)) for program in programs)
        return DataProgram(coll.method, p, loops, coll.layout(p), (scratch,) if scratch else None, ufunc,
                           coll.carries_data)
    loops = tuple(DataLoop(a, b, LoopBody.of(program)) for (a, b), program in plan.loop_programs())
    return DataProgram(coll.method, p, loops, coll.layout(p), coll.scratch_shape_of(sig, p, plan.loops), ufunc,
                       coll.carries_data)


def _scratch_end(program) -> int:
    """Elements of the scratch area a flat program addresses (0: none)."""
    end = 0
    for step in program:
        for buf, hi in ((step.t_dbuf, step.t_dhi), (step.c_dbuf, step.c_dhi)):
            hit = np.asarray(buf) == SCRATCH
            if hit.any():
                end = max(end, int(np.asarray(hi)[hit].max()))
    return end
