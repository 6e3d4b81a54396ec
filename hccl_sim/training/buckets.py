"""DDP-style gradient buckets: which gradients travel together, and when each bucket leaves.

Assignment follows torch's DistributedDataParallel (`_compute_bucket_assignment_by_size`):
parameters in reverse registration order (the order backward produces their gradients), a
parameter joins the current bucket, and the bucket closes once it holds at least its cap: the
first bucket's cap is 1 MiB (`dist._DEFAULT_FIRST_BUCKET_BYTES`), the others `bucket_cap`
(DDP's bucket_cap_mb, 25 MiB by default). `bucket_cap=None` is one bucket (no overlap).

The Reducer marks gradients ready as backward produces them; once a bucket's last gradient is
ready, its flattened gradients are all-reduced on the communication stream, entering no earlier
than the compute stream's event recorded at that moment: the AllReduce overlaps the rest of
backward in simulated time. `finish` waits for every bucket and writes the summed gradients
back.
"""
from __future__ import annotations

import numpy as np

from topologies.errors import HcclError

MIB = 1 << 20
FIRST_BUCKET_BYTES = 1 * MIB
DEFAULT_BUCKET_BYTES = 25 * MIB


def assign(sizes: list, bucket_cap: int | None = DEFAULT_BUCKET_BYTES, first_cap: int = FIRST_BUCKET_BYTES) -> list:
    """Buckets as lists of parameter indices, from the parameters' sizes in bytes (registration
    order); each bucket lists its parameters in the order backward makes their gradients."""
    order = list(range(len(sizes)))[::-1]
    if bucket_cap is None:
        return [order] if order else []
    if bucket_cap <= 0:
        raise HcclError("E_PARA", f"bucket cap must be > 0 bytes, got {bucket_cap}")
    buckets, current, filled, cap = [], [], 0, min(first_cap, bucket_cap)
    for i in order:
        current.append(i)
        filled += sizes[i]
        if filled >= cap:
            buckets.append(current)
            current, filled, cap = [], 0, bucket_cap
    if current:
        buckets.append(current)
    return buckets


class Reducer:
    """One step's gradient AllReduces for parameters `params` ([(name, layer, key)])."""

    def __init__(self, params: list, bucket_cap: int | None, sync):
        self.params, self.sync = params, sync
        sizes = [layer.params[key].nbytes for _, layer, key in params]
        self.buckets = assign(sizes, bucket_cap)
        self.bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}
        self.index = {(id(layer), key): i for i, (_, layer, key) in enumerate(params)}
        self.bucket_bytes = [sum(sizes[i] for i in members) for members in self.buckets]
        self.reset()

    def reset(self):
        self._pending = [len(members) for members in self.buckets]
        self._works = [None] * len(self.buckets)
        self.launches = []          # (bucket, simulated ns at which its gradients were all ready)

    def ready(self, layer) -> None:
        """Backward has produced `layer`'s gradients."""
        for key in layer.grads:
            b = self.bucket_of[self.index[(id(layer), key)]]
            self._pending[b] -= 1
            if self._pending[b] == 0:
                self._launch(b)

    def _launch(self, b: int):
        members = self.buckets[b]
        flat = np.concatenate([self.params[i][1].grads[self.params[i][2]].ravel() for i in members])
        self._works[b] = self.sync.all_reduce_async(flat, f"bucket{b}")
        self.launches.append((b, self.sync.compute_time()))

    def finish(self) -> None:
        """Wait for every bucket; the summed gradients replace the local ones."""
        for b, work in enumerate(self._works):
            if work is None:
                raise HcclError("E_INTERNAL", f"bucket {b} never became ready: a parameter got no gradient")
            flat = self.sync.wait(work)
            offset = 0
            for i in self.buckets[b]:
                _, layer, key = self.params[i]
                g = layer.grads[key]
                layer.grads[key] = flat[offset:offset + g.size].reshape(g.shape)
                offset += g.size
