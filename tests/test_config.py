"""HCCL_ALGO parsed as HCCL parses it, and the other HCCL_* variables validated."""
import pytest

from hccl_sim import HcclError
from hccl_sim.config.hccl_algo import parse_hccl_algo
from hccl_sim.config.env import Config

pytestmark = pytest.mark.unit

ACCEPTED = [
    ("level0:NA;level1:ring", "allreduce", {"level0": "NA", "level1": "ring"}),
    ("level0:NA;level1:H-D_R", "allgather", {"level0": "NA", "level1": "H-D_R"}),
    ("level1:NHR", "reducescatter", {"level1": "NHR"}),
    ("level0:NA;level1:NB;level2:ring", "allreduce", {"level0": "NA", "level1": "NB", "level2": "ring"}),
    ("allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:H-D_R", "allgather", {"level0": "NA", "level1": "H-D_R"}),
    ("allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:H-D_R", "broadcast", {}),
    ("alltoall=level0:NA;level1:pairwise/others=level0:NA;level1:NHR", "broadcast", {"level0": "NA", "level1": "NHR"}),
    ("allreduce=level0:NA;level1:pipeline", "allreduce", {"level0": "NA", "level1": "pipeline"}),
]

REJECTED = [
    ("level0:NA;level1:ring;", "empty level entry"),
    (";level0:NA;level1:ring", "empty level entry"),
    ("level0:NA;;level1:ring", "empty level entry"),
    ("level0:NA;level0:NA", "level0 is given twice"),
    ("level0:NA;level1:Ring", "unknown algorithm 'Ring'"),
    ("level0:NA;level1:hd", "unknown algorithm 'hd'"),
    ("level4:ring", "unknown level"),
    ("level1 ring", "is not level<N>:<algo>"),
    ("level0:NA;level1:ring;level2:ring;level3:ring;level1:NB", "at most 4"),
    ("allreduce=level0:NA;level1:ring/level0:NA;level1:ring", "mixed"),
    ("level0:NA;level1:ring/level0:NA;level1:NB", "more than one global"),
    ("allreduce=level0:NA;level1:ring/", "empty op entry"),
    ("/allreduce=level0:NA;level1:ring", "empty op entry"),
    ("allreduce=level0:NA;level1:ring/allreduce=level0:NA;level1:NB", "configured twice"),
    ("allreduc=level0:NA;level1:ring", "unknown op"),
    ("allreduce=level0:null;level1:ring", "level0 may not be null"),
]


@pytest.mark.parametrize("value,op,levels", ACCEPTED)
def test_hccl_algo_accepted(value, op, levels):
    assert parse_hccl_algo(value).levels_for(op) == levels


@pytest.mark.parametrize("value,problem", REJECTED)
def test_hccl_algo_rejected(value, problem):
    with pytest.raises(HcclError, match=problem) as info:
        Config.from_env({"HCCL_ALGO": value})
    assert info.value.code == "E_PARA"
    assert "HCCL_ALGO" in str(info.value) and "level0:NA;level1:<algo>" in str(info.value)
    assert "nor is it of the executor grammar ([HcclAlgoParser]" in str(info.value)


def test_empty_values_are_unset_and_spaces_go(monkeypatch):
    """HCCL's GetEnv reads "" as unset; its legacy parser drops every space first."""
    monkeypatch.setenv("HCCL_DETERMINISTIC", "")
    c = Config.from_env({"HCCL_ALGO": "", "HCCL_OP_EXPANSION_MODE": "", "HCCL_BUFFSIZE": ""})
    assert (c.algo, c.expansion, c.deterministic, c.buffsize_mb) == (Config().algo, None, "false", 200)
    assert not Config.from_env({"HCCL_ALGO": "  "}).algo
    assert Config.from_env({"HCCL_ALGO": " level0:NA; level1:NHR "}).algo.levels_for("allreduce") == \
        {"level0": "NA", "level1": "NHR"}


def test_expansion_modes_as_hccl_reads_them():
    """ParseOpExpansion's values, compared as written (alg_env_config.cc)."""
    for mode in ("AI_CPU", "AICPU_TS", "AICPU_CacheDisable", "AIV", "HOST", "HOST_TS", "CCU_MS", "CCU_SCHED"):
        assert Config.from_env({"HCCL_OP_EXPANSION_MODE": mode}).expansion == mode
    for bad in ("aiv", "AIV_ONLY", "GPU"):
        with pytest.raises(HcclError, match="HCCL_OP_EXPANSION_MODE.*case-sensitive"):
            Config.from_env({"HCCL_OP_EXPANSION_MODE": bad})


def test_birs_and_independent_op_are_known():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Config.from_env({"HCCL_BIRS_ENABLE": "TRUE"}).birs
        assert not Config.from_env({"HCCL_BIRS_ENABLE": "FALSE"}).birs
    with pytest.warns(UserWarning, match="exactly 'TRUE'"):
        assert not Config.from_env({"HCCL_BIRS_ENABLE": "true"}).birs
    with pytest.warns(UserWarning, match="HCCL_INDEPENDENT_OP is an HCCL variable that hccl-sim does not model"):
        Config.from_env({"HCCL_INDEPENDENT_OP": "1"})


def test_executor_grammar_is_refused_naming_it_where_hccl_reads_the_legacy_one():
    """A2 and A3 read level0:NA;level1:<algo> only: an executor expression is E_NOT_SUPPORT there,
    never HCCL's own choice in its place; one neither grammar reads is E_PARA."""
    import hccl_sim
    value = "allreduce:sequence{mesh2die,nhr};not(meshoneshot)"
    config = Config.from_env({"HCCL_ALGO": value})
    assert [e.executor for e in config.algo.executors] == ["sequence", "sole"]
    for preset in ("atlas800t-a2", "atlas900-a3"):
        with pytest.raises(HcclError) as info:
            hccl_sim.simulate("allreduce", 1 << 20, topology=hccl_sim.topology(preset, servers=2),
                              env={"HCCL_ALGO": value})
        assert info.value.code == "E_NOT_SUPPORT"
        assert "allreduce:sequence{level0=mesh2die,level1=nhr}" in str(info.value) and preset in str(info.value)


def test_env_defaults_and_values():
    c = Config.from_env({})
    assert (c.buffsize_mb, c.exec_timeout_s, c.connect_timeout_s, c.deterministic) == (200, 1836, 120, "false")
    c = Config.from_env({"HCCL_BUFFSIZE": "1", "HCCL_EXEC_TIMEOUT": "0", "HCCL_CONNECT_TIMEOUT": "7200",
                         "HCCL_OP_RETRY_ENABLE": "L1:1,L2:0", "HCCL_OP_RETRY_PARAMS": "MaxCnt:3,HoldTime:0",
                         "HCCL_DETERMINISTIC": "strict"})
    assert c.buffsize_bytes == 1 << 20 and c.wait_timeout_s is None and c.connect_timeout_s == 7200
    assert dict(c.retry_enable) == {"L1": True, "L2": False}
    assert dict(c.retry_params) == {"MaxCnt": 3, "HoldTime": 0, "IntervalTime": 1000}
    assert c.deterministic == "strict"


@pytest.mark.parametrize("var,value", [
    ("HCCL_BUFFSIZE", "0"), ("HCCL_BUFFSIZE", "200MB"), ("HCCL_BUFFSIZE", "-1"),
    ("HCCL_EXEC_TIMEOUT", "soon"), ("HCCL_CONNECT_TIMEOUT", "60"), ("HCCL_CONNECT_TIMEOUT", "7201"),
    ("HCCL_OP_RETRY_ENABLE", "L1:2"), ("HCCL_OP_RETRY_ENABLE", "L1:1,L1:0"), ("HCCL_OP_RETRY_ENABLE", "yes"),
    ("HCCL_OP_RETRY_PARAMS", "MaxCnt:11"), ("HCCL_OP_RETRY_PARAMS", "Retries:1"),
    ("HCCL_DETERMINISTIC", "maybe"),
])
def test_env_rejected(var, value):
    with pytest.raises(HcclError, match=var) as info:
        Config.from_env({var: value})
    assert info.value.code == "E_PARA" and "expected" in str(info.value)


def test_env_from_process_environment(monkeypatch):
    monkeypatch.setenv("HCCL_BUFFSIZE", "nope")
    with pytest.raises(HcclError, match="HCCL_BUFFSIZE"):
        Config.from_env()


def test_non_hccl_env_key_rejected():
    with pytest.raises(HcclError, match="not an HCCL_"):
        Config.from_env({"NCCL_ALGO": "ring"})
