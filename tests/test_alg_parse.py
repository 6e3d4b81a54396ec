"""HCCL_ALGO's executor grammar against the open-source HCCL's own unit tests, as tables.

The parse cases are hicann/hccl test/ut/common/alg_parse/alg_parse_test.cc (HcclAlgoParserTest,
every check it makes); the filter cases are update_cost_model_test.cc (UpdateCostModelTest, every
count it checks), on its ALGO_NAMES with its candidate engines Aicpu, Aiv and CcuMS.
"""
import pytest

from hccl_sim import HcclError
from hccl_sim.config.alg_parse import describe, parse_executor_config
from hccl_sim.selection.executor_filter import filter_counts

pytestmark = pytest.mark.unit


def tree(text):
    """A parse as (op, executor, enabled, ((template, enabled), ...)) per entry."""
    return [(e.op, e.executor, e.enabled, tuple((t.name, t.enabled) for t in e.templates))
            for e in parse_executor_config(text)]


# (HCCL test, input, {entry index: (op, executor, enabled, templates)} it checks, entry count).
# Where the HCCL test checks only some fields of an entry, the rest below are what its input means
# (each case's full tree is checked, not just HCCL's assertions).
PARSED = [
    ("ParseCorrectCase1",
     "allreduce:sequence{mesh2die,nhrmultilink};sole{nhr};allgather:sequence{mesh,nhr,nhr};"
     "concur{mesh,nhrmultilink}; not(meshoneshot)",
     [("allreduce", "sequence", True, (("mesh2die", True), ("nhrmultilink", True))),
      ("", "sole", True, (("nhr", True),)),
      ("allgather", "sequence", True, (("mesh", True), ("nhr", True), ("nhr", True))),
      ("", "concur", True, (("mesh", True), ("nhrmultilink", True))),
      ("", "sole", False, (("meshoneshot", True),))]),
    ("ParseCorrectCase2",
     "not(parallel{mesh,nhr});allgather:sequence{mesh,nhr};allreduce:not(sequence{mesh_multi_link,nhr})",
     [("", "parallel", False, (("mesh", True), ("nhr", True))),
      ("allgather", "sequence", True, (("mesh", True), ("nhr", True))),
      ("allreduce", "sequence", False, (("meshmultilink", True), ("nhr", True)))]),
    ("ParseCorrectCase3",
     "allgather:not(sequence{level0=mesh2die,level1=nhrmultilink}); concur{not(mesh),meshchunktwoshot};mesh_chunk",
     [("allgather", "sequence", False, (("mesh2die", True), ("nhrmultilink", True))),
      ("", "concur", True, (("mesh", False), ("meshchunktwoshot", True))),
      ("", "sole", True, (("meshchunk", True),))]),
    ("ParseCorrectCase4",
     "mesh_concur;sequence{meshtwoshot,not(nhrmultilink)};allgather:sequence{mesh,nhr}",
     [("", "sole", True, (("meshconcur", True),)),
      ("", "sequence", True, (("meshtwoshot", True), ("nhrmultilink", False))),
      ("allgather", "sequence", True, (("mesh", True), ("nhr", True)))]),
    ("ParseCorrectCase5",
     "mesh2die; sequence{meshchunk  ,not( nhrmultilink)};allgather:sequence{mesh, nhr}",
     [("", "sole", True, (("mesh2die", True),)),
      ("", "sequence", True, (("meshchunk", True), ("nhrmultilink", False))),
      ("allgather", "sequence", True, (("mesh", True), ("nhr", True)))]),
    ("ParseEmptyInput", "", []),
    ("ParseShorthand", "nhrmultilink;meshoneshot;mesh2die",
     [("", "sole", True, (("nhrmultilink", True),)), ("", "sole", True, (("meshoneshot", True),)),
      ("", "sole", True, (("mesh2die", True),))]),
    ("ParseMultipleNegatedAlgo", "allreduce:sequence{mesh2die,not(nhrmultilink),not(meshchunktwoshot)}",
     [("allreduce", "sequence", True, (("mesh2die", True), ("nhrmultilink", False), ("meshchunktwoshot", False)))]),
    # beyond HCCL's tests, what its parser does with levels, case, spaces and one trailing ';'
    ("levels placed, then compacted", "allReduce:Sequence{level1=nhr, level0 = Mesh2Die};",
     [("allreduce", "sequence", True, (("mesh2die", True), ("nhr", True)))]),
    ("a gap closes up", "sequence{level3=nhr}", [("", "sequence", True, (("nhr", True),))]),
    ("a repeated level overwrites", "sequence{level0=mesh,level0=nhr}", [("", "sequence", True, (("nhr", True),))]),
    ("an item without a level goes last", "sequence{level1=nhr, mesh}",
     [("", "sequence", True, (("nhr", True), ("mesh", True)))]),
    ("an empty template list", "allreduce:sole{}", [("allreduce", "sole", True, ())]),
    ("spaces only", "  \t", []),
    ("the issue's example", "allreduce:sequence{mesh2die,nhr};not(meshoneshot)",
     [("allreduce", "sequence", True, (("mesh2die", True), ("nhr", True))),
      ("", "sole", False, (("meshoneshot", True),))]),
]


@pytest.mark.parametrize("case,text,expected", PARSED, ids=[c[0] for c in PARSED])
def test_executor_grammar_parses_as_hccl(case, text, expected):
    assert tree(text) == expected


# (HCCL test or what it shows, input, HCCL's message)
REFUSED = [
    ("ParseErrorInvalidOpType", "invalid_op:sole{meshchunk}", "invalid opType [invalid_op] at pos 0"),
    ("ParseErrorUnclosedParen", "not(parallel{mesh2die,nhrmultilink};allgather:sequence{mesh,nhr}",
     "expected ')' after not(...) at pos 35"),
    ("ParseErrorSemicolonInBrace",
     "allgather:not(sequence{level0=mesh2die,level1=nhrmultilink}); concur{not(mesh2die),nhr;meshchunk}",
     "expected '}' at pos 86"),
    ("ParseErrorInvalidAlgoType", "allreduce:sole{invalid_algo}", "invalid algoType [invalidalgo] at pos 15"),
    ("ParseErrorInvalidExecutorType", "allreduce:invalid_exec{meshchunktwoshot}",
     "invalid executorType [invalid_exec] at pos 10"),
    ("the old grammar", "level0:NA;level1:ring", "invalid opType [level0] at pos 0"),
    ("the old per-op grammar", "allreduce=level0:NA;level1:ring", "invalid algoType [allreduce] at pos 0"),
    ("a leading ';'", ";nhr", "expected executor or template at pos 0"),
    ("';;'", "nhr;;mesh", "expected executor or template at pos 4"),
    ("not(not(...))", "not(not(nhr))", "invalid algoType [not] at pos 4"),
    ("a level without '='", "sequence{level0}", "invalid algoType [level0] at pos 9"),
    ("a level past uint32", "sequence{level4294967296=nhr}", "level 4294967296 exceeds uint32_t range"),
    ("a level past unsigned long", "sequence{level18446744073709551616=nhr}", "invalid level: 18446744073709551616"),
    ("trailing characters", "nhr mesh",
     "parse algo config failed, standard format: \"opType:executorType{level0=algoType, level1=algoType, level2=algoType};...\", trailing chars at pos 4: [mesh]"),
    ("an empty not(template)", "sequence{not()}", "expected template name at pos 13"),
    ("an unclosed not(template)", "sequence{not(nhr}", "expected ')' after not(template) at pos 16"),
]


@pytest.mark.parametrize("case,text,message", REFUSED, ids=[c[0] for c in REFUSED])
def test_executor_grammar_refuses_as_hccl(case, text, message):
    with pytest.raises(HcclError) as info:
        parse_executor_config(text)
    assert info.value.code == "E_PARA" and f"[HcclAlgoParser] {message}" in str(info.value)


def test_the_parse_reads_back_as_hccl_logs_it():
    entries = parse_executor_config("allreduce:not(sequence{mesh2die,nhr});concur{not(mesh),nhr}")
    assert describe(entries) == ("HcclAlgoExecutorParser{ executorList=[allreduce:not(sequence{level0=mesh2die,"
                                 "level1=nhr}); concur{level0=not(mesh),level1=nhr}] }")


ALGO_NAMES = [
    "AicpuAllReduceSoleMesh2Die", "AivAllReduceParallelMeshMultiLinkNHR", "CcuMSAllReduceSequenceMeshOneShotNHR",
    "CcuMSAllReduceSoleNHRMultiLink", "AivAllGatherParallelMeshTwoShotMeshChunk",
    "CcuMSBroadcastConcurMeshChunkNHRMultiLink", "AicpuAllToAllSoleMeshConcur", "AicpuAllToAllSoleNHRMultiLink",
    "DpuAllToAllSequenceMeshMeshNHR", "AivAllToAllVSequenceMeshChunkTwoShotNHRMesh",
    "AivReduceScatterSequenceNHRMultiLinkMeshOneShot", "CcuMSReduceSequenceNHRMeshTwoShot",
    "CcuMSScatterConcurMeshOneShotMesh", "AicpuAllGatherSequenceMeshMeshNHR", "AicpuAllGatherSequenceMeshNHRNHR",
]

# (HCCL test, config, names added to ALGO_NAMES, {name: expected count})
FILTERED = [
    ("PositiveExactMatch", "allReduce:sole{mesh2die}", [],
     {"AicpuAllReduceSoleMesh2Die": 1, "AivAllReduceParallelMeshMultiLinkNHR": 0,
      "CcuMSAllReduceSequenceMeshOneShotNHR": 0, "AivAllGatherParallelMeshTwoShotMeshChunk": 1,
      "AicpuAllToAllSoleMeshConcur": 1}),
    ("PositiveMultiLevelMatch", "allReduce:parallel{meshmultilink,nhr}", [],
     {"AivAllReduceParallelMeshMultiLinkNHR": 1, "AicpuAllReduceSoleMesh2Die": 0,
      "CcuMSAllReduceSequenceMeshOneShotNHR": 0}),
    ("NegativeExecutorMatch", "allReduce:not(sole{mesh2die})", [],
     {"AicpuAllReduceSoleMesh2Die": 0, "AivAllReduceParallelMeshMultiLinkNHR": 1,
      "CcuMSAllReduceSequenceMeshOneShotNHR": 1}),
    ("GlobalConfig", "sole{meshconcur}", [],
     {"AicpuAllToAllSoleMeshConcur": 1, "DpuAllToAllSequenceMeshMeshNHR": 0, "AicpuAllReduceSoleMesh2Die": 1,
      "CcuMSBroadcastConcurMeshChunkNHRMultiLink": 1}),
    ("PriorityOrder", "allReduce:sole{mesh2die};allReduce:parallel{meshmultilink,nhr}", [],
     {"AivAllReduceParallelMeshMultiLinkNHR": 1, "AicpuAllReduceSoleMesh2Die": 0,
      "CcuMSAllReduceSequenceMeshOneShotNHR": 0}),
    ("GlobalExcludeThenOpTypeEnable", "not(nhrmultilink);allReduce:sole{mesh2die}", [],
     {"AicpuAllReduceSoleMesh2Die": 1, "AivAllReduceParallelMeshMultiLinkNHR": 0,
      "CcuMSAllReduceSequenceMeshOneShotNHR": 0, "CcuMSAllReduceSoleNHRMultiLink": 0,
      "AicpuAllToAllSoleMeshConcur": 1, "AicpuAllToAllSoleNHRMultiLink": 0}),
    ("PrefixMatch", "allReduce:sole{}", ["AivAllReduceSoleMeshConcur"],
     {"AicpuAllReduceSoleMesh2Die": 1, "AivAllReduceSoleMeshConcur": 1, "AivAllReduceParallelMeshMultiLinkNHR": 0,
      "CcuMSAllReduceSequenceMeshOneShotNHR": 0}),
    ("MultipleOpTypesMatched",
     "allReduce:sole{mesh2die};allGather:parallel{meshtwoshot,meshchunk};reduceScatter:sequence{nhrmultilink,"
     "meshoneshot};broadcast:concur{meshchunk,nhrmultilink};alltoall:sole{meshconcur};alltoallv:sequence{"
     "meshchunktwoshot,nhr,mesh};scatter:concur{meshoneshot,mesh};reduce:sequence{nhr,meshtwoshot}", [],
     {"AicpuAllReduceSoleMesh2Die": 1, "AivAllGatherParallelMeshTwoShotMeshChunk": 1,
      "AivReduceScatterSequenceNHRMultiLinkMeshOneShot": 1, "CcuMSBroadcastConcurMeshChunkNHRMultiLink": 1,
      "AicpuAllToAllSoleMeshConcur": 1, "AivAllToAllVSequenceMeshChunkTwoShotNHRMesh": 1,
      "CcuMSScatterConcurMeshOneShotMesh": 1, "CcuMSReduceSequenceNHRMeshTwoShot": 1,
      "AivAllReduceParallelMeshMultiLinkNHR": 0, "CcuMSAllReduceSequenceMeshOneShotNHR": 0}),
    ("EmptyParser", "", [], {}),
    ("NoMatchExecutorType", "allReduce:pipeline{mesh2die}", [], {}),
    ("NegatedAlgoFuzzyMatch", "allGather:sequence{mesh,not(nhr),nhr}", [],
     {"AicpuAllGatherSequenceMeshMeshNHR": 1, "AicpuAllGatherSequenceMeshNHRNHR": 0,
      "AivAllGatherParallelMeshTwoShotMeshChunk": 0}),
    ("NegatedAlgoExcludeOthers", "allReduce:sequence{mesh,not(nhr)}",
     ["AicpuAllReduceSequenceMeshMesh2Die", "AivAllReduceSequenceMeshNHR"],
     {"AicpuAllReduceSequenceMeshMesh2Die": 1, "AivAllReduceSequenceMeshNHR": 0, "AicpuAllReduceSoleMesh2Die": 0}),
    ("NegatedExecutorMarksOpType", "allReduce:not(parallel{meshmultilink,nhr})", [],
     {"AivAllReduceParallelMeshMultiLinkNHR": 0, "AicpuAllReduceSoleMesh2Die": 1,
      "CcuMSAllReduceSequenceMeshOneShotNHR": 1}),
    ("PipelineMatch", "allReduce:pipeline{mesh2die}", ["AicpuAllReducePipeLineMesh2Die"],
     {"AicpuAllReducePipeLineMesh2Die": 1, "AicpuAllReduceSoleMesh2Die": 0,
      "AivAllReduceParallelMeshMultiLinkNHR": 0}),
    ("MultipleNegatedAlgoLevels", "allReduce:sequence{mesh2die,not(nhr),not(meshoneshot)}",
     ["AicpuAllReduceSequenceMesh2DieMeshMesh2Die", "AicpuAllReduceSequenceMesh2DieNHRMesh",
      "AicpuAllReduceSequenceMesh2DieMeshMeshOneShot"],
     {"AicpuAllReduceSequenceMesh2DieMeshMesh2Die": 1, "AicpuAllReduceSequenceMesh2DieNHRMesh": 0,
      "AicpuAllReduceSequenceMesh2DieMeshMeshOneShot": 0, "AicpuAllReduceSoleMesh2Die": 0}),
]


@pytest.mark.parametrize("case,text,added,expected", FILTERED, ids=[c[0] for c in FILTERED])
def test_executor_filter_counts_as_hccl(case, text, added, expected):
    counts = dict.fromkeys(ALGO_NAMES + added, 1)
    out = filter_counts(parse_executor_config(text), counts, ["Aicpu", "Aiv", "CcuMS"])
    assert {name: out[name] for name in expected} == expected
    if case in ("EmptyParser", "NoMatchExecutorType"):
        # nothing matched: only the engine filter acted (Dpu is no candidate)
        assert out == {name: int(not name.startswith("Dpu")) for name in counts}


def test_executor_filter_needs_an_engine():
    with pytest.raises(HcclError, match="at least one candidate engine"):
        filter_counts((), {"AicpuAllReduceSoleMesh2Die": 1}, [])
