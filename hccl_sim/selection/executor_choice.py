"""The 950's choice with HCCL_ALGO's executor grammar honoured (docs/references.md §6.13, §7.7).

Without HCCL_ALGO (or with a legacy value, which the 950's HCCL also reads), HCCL's rule-based
selectors decide (selection.hccl_950). With an executor expression, the algorithms hccl-sim runs
for the op on this shape are HCCL's candidates (`<Engine><Op><Executor><Templates>` names, the
AICPU_TS engine), filtered as HCCL's UpdateCostModelWithAlgo filters them (selection.
executor_filter); HCCL's own rule choice runs if it is left, else the fastest left by this
emulator's timing model (HCCL's cost-model engine also takes the least cost). An entry for the op
that names an algorithm hccl-sim does not run here (a CCU or AIV template, an executor of another
level count) is E_NOT_SUPPORT naming it, never a silent replacement; an expression that leaves the
op nothing is E_NOT_SUPPORT too.
"""
from __future__ import annotations

import warnings

from topologies.errors import HcclError

from ..config.hccl_algo import parse_hccl_algo
from ..config.alg_parse import ALGO_TYPES, ENGINE_TYPES, EXECUTOR_TYPES, OP_TYPES
from . import hccl_950, hccl_950_gates, hccl_950_kernels
from .executor_filter import filter_counts, hits

ENGINE = "Aicpu"
# What hccl-sim runs of HCCL's AICPU algorithms, by op: (executor, templates, levels run as):
# "flat:<algorithm>" over every rank, "levels" (the mesh, NHR, NHR one after another), or
# "squeezed" (HCCL's Parallel over a SuperPoD and across SuperPoDs), "pipeline" (OmniPipe); and on
# which level counts HCCL registers it (1: one server; 2: a SuperPoD; 3: several).
ONE, MANY, TWO, THREE = (1,), (2, 3), (2,), (3,)
_MESH = [("Sole", "Mesh", "flat:fullmesh", ONE), ("Sole", "MeshConcur", "flat:fullmesh", ONE)]
_ACROSS = [("Sole", "NHR", "flat:NHR", MANY), ("Parallel", "MeshNHR", "levels", TWO),
           ("Sequence", "MeshConcurNHR", "levels", TWO), ("Sequence", "MeshConcurNHRNHR", "levels", THREE),
           ("PipeLine", "", "pipeline", THREE)]
CANDIDATES = {
    "allreduce": [("Sole", "MeshOneShot", "flat:mesh_oneshot", ONE), ("Sole", "MeshTwoShot", "flat:fullmesh", ONE),
                  ("Sole", "MeshChunkTwoShot", "flat:mesh_chunk", ONE), ("Sole", "MeshConcur", "flat:fullmesh", ONE),
                  ("Sole", "NHRAicpuReduce", "flat:NHR", MANY)] + _ACROSS,
    "allgather": _MESH + _ACROSS + [("Parallel", "NHRNHR", "squeezed", THREE)],
    "reducescatter": _MESH + [("Sole", "MeshChunk", "flat:mesh_chunk", ONE)] + _ACROSS
    + [("Sole", "NHRAicpuReduce", "flat:NHR", MANY)],
    "broadcast": [("Sole", "MeshTwoShot", "flat:fullmesh", ONE), ("Sole", "NHR", "flat:NHR", MANY),
                  ("Parallel", "MeshNHR", "levels", TWO), ("Sequence", "Mesh1dNHRNHR", "levels", THREE)],
    "reduce": [("Sole", "Mesh", "flat:mesh_oneshot", ONE), ("Sole", "MeshTwoShot", "flat:fullmesh", ONE),
               ("Sole", "NHR", "flat:NHR", MANY), ("Sole", "NHRAicpuReduce", "flat:NHR", MANY),
               ("Parallel", "MeshNHR", "levels", TWO), ("Sequence", "Mesh1DNHRNHR", "levels", THREE)],
    "scatter": [("Sole", "Mesh", "flat:fullmesh", ONE), ("Sole", "NHR", "flat:NHR", MANY),
                ("Parallel", "MeshNHR", "levels", TWO)],
    "alltoall": [("Sole", "Mesh", "flat:fullmesh", ONE + MANY), ("Sole", "MeshSingleChannel", "flat:fullmesh", ONE + MANY)],
    "alltoallv": [("Sole", "Mesh", "flat:fullmesh", ONE + MANY)],
    "alltoallvc": [("Sole", "Mesh", "flat:fullmesh", ONE + MANY)],
    "allgatherv": [("Sole", "Mesh", "flat:fullmesh", ONE + MANY)],
    "reducescatterv": [("Sole", "Mesh", "flat:fullmesh", ONE + MANY)],
}


def _full_name(op: str, executor: str, templates: str) -> str:
    return f"{ENGINE}{OP_TYPES[op]}{executor}{templates}"


def candidates(name: str, shape) -> dict:
    """{HCCL algorithm name: how hccl-sim runs it} for this op on this shape's level count."""
    return {_full_name(name, e, t): how for e, t, how, levels in CANDIDATES.get(name, ()) if shape.L in levels}


def _choice_of(ctx, full: str, how: str, shape):
    if how == "levels":
        return hccl_950._levels(full, shape, split=hccl_950.modelled_split(ctx, shape, full))
    if how == "squeezed":
        return hccl_950._squeezed(ctx, shape, full)
    if how == "pipeline":
        return hccl_950.pipeline(ctx, shape)
    return hccl_950._flat(ctx, how.split(":", 1)[1], full)


def _entries(ctx):
    """The executor entries asked for: `algo=` (read as HCCL_ALGO: a template alone, `nhr`, is
    `sole{nhr}`), else HCCL_ALGO; a legacy value is read by HCCL but its levels steer none of the
    950's selectors: said once."""
    algo, source = ctx.config.algo, "HCCL_ALGO"
    if ctx.signature.algo is not None:
        if not isinstance(ctx.signature.algo, str):
            raise HcclError("E_PARA", f"algo must be a string, got {type(ctx.signature.algo).__name__}")
        algo, source = parse_hccl_algo(ctx.signature.algo, source="algo"), "algo"
    if algo and algo.executors is None:
        key = ("legacy on a5", algo.text)
        if key not in _said:
            _said.add(key)
            warnings.warn(f"{source}={algo.text!r} is HCCL_ALGO's legacy grammar: the 950's HCCL reads it and its "
                          "selectors do not use it; the open-source HCCL's executor grammar steers them "
                          "(e.g. 'allreduce:sole{nhr}')", UserWarning, stacklevel=4)
    return algo.executors, algo.text


_said = set()


COST_MODEL_OPS = ("allreduce", "reducescatter", "allgather")
"""The ops HCCL_USE_NEW_SELECTOR=1 gives to HCCL's cost-model engine (op_common.cc Selector,
selector_engine.cc; docs/references.md §6.13)."""


def choose(ctx):
    """The 950's choice for this call, HCCL_ALGO's executor entries honoured; with
    HCCL_USE_NEW_SELECTOR=1, an AllReduce's, ReduceScatter's or AllGather's the least cost of its
    candidates (HCCL's cost-model engine, SelectMinCost: the first in table order on a tie),
    costed by hccl-sim's timing model: HCCL's own cost coefficients (cost_model.cc, cost_table.cc)
    are not reproduced, and the label says so."""
    entries, text = _entries(ctx)
    rule = hccl_950_kernels.rule_choice(ctx)
    op = hccl_950.op_of(ctx)
    least = ctx.config.new_selector and op in COST_MODEL_OPS
    if (not entries and not least) or ctx.topo.num_ranks == 1 or rule.executor is None:   # the barrier names none
        return rule
    shape = hccl_950.Shape(ctx)
    # servers of unequal size: hccl-sim runs HCCL's one NHR over every rank there and nothing else,
    # so an entry naming another algorithm is refused like any other it does not run
    table = candidates(op, shape) if shape.equal else {rule.executor: None}
    engines = [ENGINE]
    if rule.expansion is not None:          # a CCU or AIV kernel: its engines come first in HCCL's chain
        engines = [ENGINE_TYPES[e.lower().replace("_", "")] for e in hccl_950_gates.CHAINS[ctx.config.expansion]]
        engines.append(ENGINE)
        table = {rule.executor: None, **table}
    left = list(table)
    if entries:
        _refuse_unknown(ctx, entries, {name: 1 for name in table}, engines)
        kept = filter_counts(entries, dict.fromkeys(table, 1), engines)
        left = [full for full, count in kept.items() if count]
        if not left:
            raise HcclError("E_NOT_SUPPORT", f"HCCL_ALGO={text!r} leaves {OP_TYPES[op]} no algorithm on "
                            f"{ctx.topo.name} with {ctx.topo.num_ranks} ranks (hccl-sim runs {', '.join(table)} here)")
    if rule.executor in left and not least:
        return rule
    choices = [rule if full == rule.executor else _choice_of(ctx, full, table[full], shape) for full in left]
    best = min(choices, key=ctx.price)
    why = ("HCCL_USE_NEW_SELECTOR=1: the least cost of HCCL's candidates, by hccl-sim's timing model (not HCCL's "
           "cost coefficients)") if least else "HCCL_ALGO's pick: the fastest it leaves"
    return best._replace(note="; ".join(n for n in (best.note, why) if n))


def _refuse_unknown(ctx, entries, table, engines) -> None:
    """E_NOT_SUPPORT for a wanted entry for this op that names nothing hccl-sim runs here."""
    op = hccl_950.op_of(ctx)
    for entry in entries:
        if entry.op != op or not entry.enabled or hits(entry, OP_TYPES[op], engines, table):
            continue
        named = _full_name(op, EXECUTOR_TYPES[entry.executor], "".join(ALGO_TYPES[t.name] for t in entry.templates))
        raise HcclError("E_NOT_SUPPORT", f"HCCL_ALGO entry {entry.text()} names {named}, which hccl-sim does not run on "
                        f"{ctx.topo.name} for {ctx.topo.num_ranks} ranks (it runs {', '.join(table)}; of the CCU "
                        "and AIV engines, only the algorithm HCCL_OP_EXPANSION_MODE's selector picks for the call)")
