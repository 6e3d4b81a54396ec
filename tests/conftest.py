"""Shared helpers: symbolic buffers for schedule verification and small topologies."""
import numpy as np
import pytest

import hccl_sim


def add(a, b, out):
    np.add(a, b, out=out)


def onehot_input(rank, p, rows, cols, index_of):
    """Symbolic buffer: per element a count per source rank and, per source, the element's index + 1.

    After any correct collective, every output element holds count 1 for exactly the right
    sources and the right index: a lost, duplicated or misplaced contribution shows up.
    """
    x = np.zeros((rows, cols, 2 * p))
    x[:, :, rank] = 1
    x[:, :, p + rank] = index_of(np.arange(rows)[:, None], np.arange(cols)[None, :])
    return x


@pytest.fixture
def fullmesh():
    def make(p, bandwidth=1e9, latency=1e-6, reduce_bandwidth=2e9):
        return hccl_sim.topology("fullmesh", ranks=p, bandwidth=bandwidth, latency=latency,
                                 reduce_bandwidth=reduce_bandwidth)
    return make
