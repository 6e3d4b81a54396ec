"""The training data: scikit-learn's bundled handwritten digits (1,797 8x8 images, 10 classes).

The CSV that ships inside the scikit-learn wheel is read directly: importing `sklearn` (and its
scipy stack) takes seconds, reading the file tens of milliseconds. Features are standardised
(zero mean, unit variance per pixel; constant pixels become 0).

Batches are global: step s uses the same samples whatever the number of ranks (a seeded
permutation per epoch, cut into batches of `batch`), and rank r of p trains on the r-th of p
contiguous shards of it (sizes differ by at most one, so any rank count divides any batch). So
data-parallel training on p ranks sees exactly the samples that one process would see on the
whole batch, and survivors of a crash simply re-shard the same batches.
"""
from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np

from topologies.errors import HcclError

FEATURES, CLASSES = 64, 10


def digits_path() -> str:
    spec = importlib.util.find_spec("sklearn")        # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise HcclError("E_NOT_FOUND", "scikit-learn is not installed: `pip install scikit-learn` (its bundled "
                        "digits data set is the training data)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "datasets", "data", "digits.csv.gz")
    if not os.path.exists(path):
        raise HcclError("E_NOT_FOUND", f"scikit-learn's digits data set is not at {path}")
    return path


@functools.lru_cache(maxsize=1)
def load_digits() -> tuple:
    """(features float32 [1797, 64] standardised, labels int64 [1797]); read once per process."""
    raw = np.loadtxt(digits_path(), delimiter=",")
    x, y = raw[:, :FEATURES], raw[:, FEATURES].astype(np.int64)
    std = x.std(axis=0)
    x = (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)
    x, y = x.astype(np.float32), y
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


class Batches:
    """The global batch of each step: epoch e is a permutation seeded by (seed, e), cut into
    `batch`-sized batches (a last partial batch is dropped, as DataLoader's drop_last)."""

    def __init__(self, num_samples: int, batch: int, seed: int):
        if not 1 <= batch <= num_samples:
            raise HcclError("E_PARA", f"batch must be an integer in [1, {num_samples}] (the data set's size), "
                            f"got {batch}")
        self.num_samples, self.batch, self.seed = num_samples, batch, seed
        self.per_epoch = num_samples // batch

    def indices(self, step: int) -> np.ndarray:
        epoch, k = divmod(step, self.per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
        return order[k * self.batch:(k + 1) * self.batch]


def shard(indices: np.ndarray, rank: int, size: int) -> np.ndarray:
    """Rank `rank`'s contiguous share of a global batch among `size` ranks."""
    n = len(indices)
    return indices[rank * n // size:(rank + 1) * n // size]
