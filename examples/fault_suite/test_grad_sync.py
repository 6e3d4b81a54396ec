"""The project's tests. Plain `pytest` runs each once, fault-free, and both pass; `pytest
--hccl-chaos 200` runs each under 200 fault scenarios against its fault-free twin: the retrying
sync passes (every scenario recovers or ends in a clean error), the local fallback fails WRONG.
"""
import hccl_sim
import pytest

from grad_sync import ENV, TOPOLOGY, sync_or_local, sync_with_retries, train


@pytest.mark.hccl_chaos(max_faults=2)
def test_training_with_retried_syncs():
    weights = hccl_sim.run(train, topology=TOPOLOGY, env=ENV, args=(sync_with_retries,))
    assert all((w == weights[0]).all() for w in weights)


@pytest.mark.hccl_chaos(max_faults=2)
def test_training_with_a_local_fallback():
    weights = hccl_sim.run(train, topology=TOPOLOGY, env=ENV, args=(sync_or_local,))
    assert all((w == weights[0]).all() for w in weights)
