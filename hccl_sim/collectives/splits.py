"""How a variable-size call's elements split among ranks (`hccl-sim bench --op alltoallv --counts
...`, tests and experiments; `Collective.counts_for` takes one): how each rank's send buffer
splits among its peers (AlltoAllV, VC: a p x p matrix), or how an op's data
splits into rank blocks (AllGatherV, ReduceScatterV: p counts, `vector`).

- `uniform`: every peer (block) the same share (the remainder to the first), AlltoAll's pattern;
- `zipf:S`: mixture-of-experts routing, one expert per rank: expert popularity falls as
  1 / k^S over a fixed random ranking of the experts, and each rank's tokens go to experts drawn
  from it (a multinomial of the rank's elements, seeded by the rank): hot experts receive most.
  For p counts: the blocks' sizes are one such draw (uneven shards);
- a JSON file: a p x p matrix of non-negative weights (or {"counts": matrix}), or for p counts
  a list of p weights; row i is scaled to rank i's elements (largest remainders), so one file
  serves every size of the sweep.

Every matrix's row i sums to rank i's send elements exactly; entry [i][j] is what i sends j.
Every vector sums to the op's elements exactly.
"""
from __future__ import annotations

import json
import math
import re

import numpy as np

from topologies.errors import HcclError

SEED = 2026
"""The expert ranking's and the routing's seed: a bench's counts are the same on every run."""


class Counts:
    """A parsed --counts: `matrix(p, elements)` gives the p x p matrix for one size."""

    def __init__(self, kind: str, s: float = 0.0, weights=None, text: str = "uniform"):
        self.kind, self.s, self.weights, self.text = kind, s, weights, text

    def __repr__(self):
        return self.text

    def matrix(self, p: int, elements: int) -> np.ndarray:
        if self.kind == "uniform":
            row = np.full(p, elements // p, dtype=np.int64)
            row[:elements % p] += 1
            return np.tile(row, (p, 1))
        if self.kind == "zipf":
            rng = np.random.default_rng(SEED)
            rank_of_expert = rng.permutation(p)
            w = 1.0 / (rank_of_expert + 1.0) ** self.s
            w /= w.sum()
            return np.stack([np.random.default_rng((SEED, i)).multinomial(elements, w) for i in range(p)]).astype(np.int64)
        weights = self.weights
        if weights.shape != (p, p):
            got = f"a {weights.shape[0]} x {weights.shape[1]} matrix" if weights.ndim == 2 else f"a list of {len(weights)}"
            raise HcclError("E_PARA", f"--counts {self.text}: {got} for {p} ranks; it must be a {p} x {p} matrix")
        return np.stack([_scaled(weights[i], elements, f"--counts {self.text}: row {i}") for i in range(p)])

    def vector(self, p: int, elements: int) -> np.ndarray:
        """p block counts summing to `elements`."""
        if self.kind == "uniform":
            row = np.full(p, elements // p, dtype=np.int64)
            row[:elements % p] += 1
            return row
        if self.kind == "zipf":
            rng = np.random.default_rng(SEED)
            w = 1.0 / (rng.permutation(p) + 1.0) ** self.s
            return np.random.default_rng((SEED, p)).multinomial(elements, w / w.sum()).astype(np.int64)
        weights = self.weights
        if weights.shape != (p,):
            raise HcclError("E_PARA", f"--counts {self.text}: {'a matrix' if weights.ndim == 2 else len(weights)} "
                            f"for an op of {p} rank blocks; it must be a list of {p} weights")
        return _scaled(weights, elements, f"--counts {self.text}")


def _scaled(w, total: int, what: str) -> np.ndarray:
    """Integers proportional to `w` summing to `total` (largest remainders)."""
    s = float(w.sum())
    if s <= 0:
        if total:
            raise HcclError("E_PARA", f"{what} is all zeros: it cannot carry {total} elements")
        return np.zeros(len(w), dtype=np.int64)
    exact = w / s * total
    out = np.floor(exact).astype(np.int64)
    short = total - int(out.sum())
    out[np.argsort(-(exact - out), kind="stable")[:short]] += 1
    return out


def parse(text: str) -> Counts:
    """`uniform`, `zipf:S` (S > 0) or a JSON file's path; E_PARA naming what is wrong."""
    text = str(text)
    if text == "uniform":
        return Counts("uniform")
    m = re.fullmatch(r"zipf:([0-9]*\.?[0-9]+)", text)
    if m:
        s = float(m.group(1))
        if not s > 0 or not math.isfinite(s):
            raise HcclError("E_PARA", f"--counts {text}: the zipf exponent must be > 0")
        return Counts("zipf", s, text=text)
    if text.startswith("zipf"):
        raise HcclError("E_PARA", f"--counts {text!r}: expected zipf:S with an exponent S > 0, e.g. zipf:1.2")
    if not text.endswith(".json"):
        raise HcclError("E_PARA", f"--counts {text!r}: expected uniform, zipf:S or a .json file of a p x p matrix")
    try:
        with open(text, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise HcclError("E_PARA", f"--counts {text}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise HcclError("E_PARA", f"--counts {text}: not JSON ({exc})") from None
    if isinstance(data, dict):
        data = data.get("counts")
    try:
        weights = np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError):
        weights = None
    if weights is None or weights.ndim not in (1, 2) or (weights.ndim == 2 and weights.shape[0] != weights.shape[1]) \
            or not np.isfinite(weights).all() or (weights < 0).any():
        raise HcclError("E_PARA", f"--counts {text}: expected a square matrix (or a list, for allgatherv and "
                        "reducescatterv) of non-negative numbers (or {\"counts\": ...})")
    return Counts("file", weights=weights, text=text)
