"""The training data: the UCI optical-recognition handwritten digits (1,797 8x8 images, 10 classes).

`data/digits.csv.gz` ships with hccl-sim: it is the test set of the UCI ML hand-written digits data
set (E. Alpaydin, C. Kaynak, 1998; https://archive.ics.uci.edu/ml/datasets/Optical+Recognition+of+Handwritten+Digits,
CC BY 4.0), byte for byte the copy scikit-learn bundles as `load_digits`, so no package is needed
to train and the losses are the ones scikit-learn's copy gives. Each row is 64 pixel counts in
0..16, then the label. Features are standardised (zero mean, unit variance per pixel; constant
pixels become 0).

Batches are global: step s uses the same samples whatever the number of ranks (a seeded
permutation per epoch, cut into batches of `batch`), and rank r of p trains on the r-th of p
contiguous shards of it (sizes differ by at most one, so any rank count divides any batch). So
data-parallel training on p ranks sees exactly the samples that one process would see on the
whole batch, and survivors of a crash simply re-shard the same batches.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from topologies.errors import HcclError

FEATURES, CLASSES = 64, 10


def digits_path() -> str:
    path = os.path.join(os.path.dirname(__file__), "data", "digits.csv.gz")
    if not os.path.exists(path):
        raise HcclError("E_NOT_FOUND", f"the digits data set is not at {path}: hccl-sim's installation is "
                        "incomplete (reinstall it)")
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
