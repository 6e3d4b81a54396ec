"""Fault suites of the user's own code (hccl_sim.testing): the library's explore and replay on the
example project's training (examples/fault_suite), the pytest plugin run as a user runs it, bad
input, and the same seed giving the same scenarios and outcomes on local and Ray."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hccl_sim
from hccl_sim.faults.fault_plan import FaultPlan
from hccl_sim.testing import explore, replay, same
from hccl_sim.testing import token as tokens

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "examples" / "fault_suite"
sys.path.insert(0, str(PROJECT))
import grad_sync  # noqa: E402


def _training(sync, engine="local", cluster=None):
    def body():
        if cluster is not None:
            weights = cluster.run(grad_sync.train, args=(sync,), env=grad_sync.ENV)
        else:
            weights = hccl_sim.run(grad_sync.train, topology=grad_sync.TOPOLOGY, env=grad_sync.ENV, args=(sync,),
                                   engine=engine)
        assert all((w == weights[0]).all() for w in weights)
    return body


@pytest.mark.local
def test_the_op_log_keeps_every_op_with_its_communicator_and_number():
    def fn(comm):
        comm.op_log = []
        comm.all_reduce(np.arange(4) + comm.rank)
        sub = comm.split(comm.rank % 2)
        sub.broadcast(np.arange(3), root=0)
        if comm.rank == 0:
            comm.send(np.arange(2), 1)
        elif comm.rank == 1:
            comm.recv(0)
        return [(op.scope, op.world_ranks, op.seq, op.record.name) for op in comm.op_log]
    logs = hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=4, bandwidth=1e9, latency=1e-6))
    world = [op for op in logs[0] if op[0] == ""]
    sub = [op for op in logs[0] if op[0] != ""]
    assert world[:2] == [("", (0, 1, 2, 3), 0, "all_reduce"), ("", (0, 1, 2, 3), 1, "all_gather")]  # the split's colours
    assert [op[1:] for op in sub] == [((0, 2), 0, "all_gather"), ((0, 2), 1, "broadcast")]         # its init, its op
    assert logs[0][-1][2:] == (None, "send") and logs[1][-1][2:] == (None, "recv")
    assert len(logs[2]) == 4 and [op[1] for op in logs[1] if op[0] != ""] == [(1, 3), (1, 3)]


@pytest.mark.unit
def test_results_compare_bit_for_bit_and_timing_records_are_not_compared():
    assert same([np.arange(3), {"a": 1.5}], [np.arange(3), {"a": 1.5}]) is None
    assert "element 1" in same(np.array([0, 1]), np.array([0, 2]))
    assert "int32" in same(np.zeros(2, np.int32), np.zeros(2, np.int64))
    assert same(float("nan"), float("nan")) is None
    r1 = hccl_sim.OpRecord("all_reduce", "ring", 8, 2, "int32", 0, 10)
    assert same((np.zeros(2), r1), (np.zeros(2), r1._replace(end=99))) is None


@pytest.mark.local
def test_the_retrying_sync_passes_and_the_local_fallback_is_found_shrunk_and_replayed():
    good = explore(_training(grad_sync.sync_with_retries), "good", n=25, seed=3)
    assert not good.failed and len(good.scenarios) == 25
    counts = good.counts()
    assert counts["recovered"] > 0 and counts["clean error"] > 0 and counts["WRONG"] == 0

    bad = explore(_training(grad_sync.sync_or_local), "bad", n=60, seed=3)
    assert bad.failed and bad.failure.outcome == "WRONG"
    shrunk = bad.shrunk
    assert shrunk.outcome == "WRONG" and len(shrunk.plan.entries) == 1          # one fault is enough
    assert shrunk.plan.entries[0]["kind"] in ("link_flap", "nic_down", "link_down", "corrupt")
    assert "hccl-chaos bad:" in bad.summary() and "1 WRONG" in bad.summary()
    again = replay(_training(grad_sync.sync_or_local), bad.token, "bad")
    assert again.plan.to_dict() == shrunk.plan.to_dict()
    assert (again.outcome, again.verdict.detail) == (shrunk.outcome, shrunk.verdict.detail)   # bit for bit


@pytest.mark.local
def test_the_same_seed_draws_the_same_scenarios_with_the_same_outcomes():
    runs = [explore(_training(grad_sync.sync_with_retries), "t", n=12, seed=11) for _ in range(2)]
    a, b = ([(s.plan.to_dict(), s.outcome, s.verdict.detail) for s in r.scenarios] for r in runs)
    assert a == b
    other = explore(_training(grad_sync.sync_with_retries), "t", n=12, seed=12)
    assert [s.plan.to_dict() for s in other.scenarios] != [p for p, *_ in a]


@pytest.mark.local
def test_a_users_check_judges_results_that_differ_by_design():
    def body():
        hccl_sim.run(grad_sync.train, topology=grad_sync.TOPOLOGY, env=grad_sync.ENV,
                     args=(grad_sync.sync_or_local,))

    def replicas_agree(results, twin):
        alive = [w for w in results if w is not None]
        assert all((w == alive[0]).all() for w in alive), "the replicas drifted apart"
    report = explore(body, "check", n=40, seed=3, check=replicas_agree, kinds=("link_flap", "link_down"))
    assert report.failed and "the replicas drifted apart" in report.shrunk.verdict.detail


@pytest.mark.unit
def test_replay_tokens_refuse_another_test_or_version_and_damage():
    plan = FaultPlan().link_down(0, 1, at=1e-6)
    token = tokens.encode("a::test", plan)
    assert tokens.decode(token, "a::test").to_dict() == plan.to_dict()
    with pytest.raises(hccl_sim.HcclError, match="another test's"):
        tokens.decode(token, "b::test")
    with pytest.raises(hccl_sim.HcclError, match="damaged"):
        tokens.decode(token[:-6], "a::test")
    with pytest.raises(hccl_sim.HcclError, match="not an hccl-sim replay token"):
        tokens.decode("abc", "a::test")


@pytest.mark.local
def test_a_test_without_runs_or_a_bad_kind_says_so():
    with pytest.raises(hccl_sim.HcclError, match="no hccl_sim run"):
        explore(lambda: None, "empty", n=2)
    with pytest.raises(hccl_sim.HcclError, match="unknown fault kind"):
        explore(_training(grad_sync.sync_with_retries), "k", n=2, kinds=("meteor",))


def _pytest(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:logging", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.local
def test_the_plugin_runs_the_example_project_as_a_user_does(tmp_path):
    plain = _pytest(str(PROJECT))
    assert plain.returncode == 0, plain.stdout[-2000:]                  # without the option: once, fault-free
    report = tmp_path / "chaos.json"
    out = _pytest(str(PROJECT), "--hccl-chaos", "30", "--hccl-seed", "5", "--hccl-report", str(report))
    assert out.returncode == 1, out.stdout[-3000:]
    text = out.stdout
    assert "test_training_with_retried_syncs: 30 scenarios:" in text and " 0 WRONG, 0 HANG, 0 LEAK" in text
    assert "FAILED" in text and "test_training_with_a_local_fallback" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("replay: pytest "))
    data = json.loads(report.read_text())
    tests = {t["nodeid"].split("::")[-1]: t for t in data["tests"]}
    assert len(tests["test_training_with_retried_syncs"]["scenarios"]) == 30
    assert not tests["test_training_with_retried_syncs"]["failures"]
    failure = tests["test_training_with_a_local_fallback"]["failures"][0]
    assert failure["outcome"] == "WRONG" and len(failure["shrunk"]["faults"]) == 1
    assert line.endswith(failure["replay"])
    again = _pytest(*line.split()[2:])
    assert again.returncode == 1 and "replay: WRONG" in again.stdout
    assert again.stdout.count("plan:") >= 1 and yaml_faults(again.stdout) == failure["shrunk"]["faults"]
    other = _pytest(line.split()[2].replace("local_fallback", "..."), *line.split()[3:])
    assert other.returncode != 0


def yaml_faults(text):
    import yaml
    block = text.split("plan:\n", 1)[1].split("\n\n", 1)[0]
    lines = []
    for ln in block.splitlines():
        if not ln.startswith("  "):
            break
        lines.append(ln[2:])
    return yaml.safe_load("\n".join(lines))["faults"]


@pytest.mark.local
def test_a_bad_marker_or_token_is_a_one_line_usage_error(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n@pytest.mark.hccl_chaos(kinds=('meteor',))\ndef test_a():\n    pass\n\n"
        "@pytest.mark.hccl_chaos(max_fault=3)\ndef test_b():\n    pass\n")
    out = _pytest(str(tmp_path / "test_x.py"), "--hccl-chaos", "3", cwd=tmp_path)
    assert out.returncode == 4 and "unknown fault kind(s) ['meteor']" in out.stderr
    out = _pytest(str(tmp_path / "test_x.py") + "::test_b", "--hccl-chaos", "3", cwd=tmp_path)
    assert out.returncode == 4 and "has no argument max_fault" in out.stderr
    out = _pytest(str(tmp_path / "test_x.py") + "::test_b", "--hccl-replay", "hcc1-abc", cwd=tmp_path)
    assert out.returncode == 4


@pytest.mark.ray
def test_the_same_seed_gives_the_same_scenarios_and_outcomes_on_ray_and_local(ray_cluster):
    import ray.cloudpickle
    ray.cloudpickle.register_pickle_by_value(grad_sync)      # the actors have no examples/ on their path
    local = explore(_training(grad_sync.sync_with_retries), "t", n=6, seed=2)
    with hccl_sim.Cluster(grad_sync.TOPOLOGY, engine="ray") as cluster:
        on_ray = explore(_training(grad_sync.sync_with_retries, cluster=cluster), "t", n=6, seed=2)
    assert [(s.plan.to_dict(), s.outcome, s.verdict.detail) for s in local.scenarios] == \
        [(s.plan.to_dict(), s.outcome, s.verdict.detail) for s in on_ray.scenarios]
