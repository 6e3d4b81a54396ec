"""Ranks of a Ray job that meet by a group's name alone (ray.util.collective's init_collective_group:
no driver hands them each other's actors) find each other through Ray's internal key-value store,
as Ray's own gloo group does, and then connect exactly as a torchrun script's ranks do
(engines.torchrun.connect: socket endpoints, a control block per host, the shared-memory plane on
one host): `KVStore` gives the GCS's key-value table the shape of torch's store that `connect`
uses (set, a get that waits, an atomic add).

`meet(name, rank, size, topo, config)` is one rank's arrival:
1. rank 0 names the incarnation (a fresh id under the group's key); the others wait for it. Every
   later key lives under it, so a group destroyed and made again under the same name never reads
   its predecessor's addresses. Rank 0 removes the name once its connect has found every rank's
   address (each read the name before publishing one), so the next incarnation's ranks wait for
   the next name, as Ray's gloo rendezvous removes its master address after init.
2. each rank publishes its Ray node; all of them on one node is torchrun's single host (loopback,
   the shared-memory plane), else a node is a host (its ranks read each other in place, TCP across
   on the node's address).
3. torchrun's connect through the store; the last rank through removes the incarnation's keys.
Every wait ends by HCCL_CONNECT_TIMEOUT with E_TIMEOUT naming what was missing.
"""
from __future__ import annotations

import time
import uuid

from topologies.errors import HcclError

NAMESPACE = "hccl_sim"
_POLL_S = 0.005


class KVStore:
    """torch's Store shape over Ray's internal KV, every key under `prefix`: `set`, `get` (waits
    for the key until `timeout_s`, then E_TIMEOUT, which a caller that catches torch's store
    timeouts, RuntimeError, catches too), `add` (atomic), `delete_all`."""

    def __init__(self, prefix: str, timeout_s: float):
        import ray.experimental.internal_kv as kv
        self.prefix, self.timeout_s, self._kv = prefix, float(timeout_s), kv

    def set(self, key: str, value) -> None:
        self._kv._internal_kv_put(self.prefix + key, value, overwrite=True, namespace=NAMESPACE)

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        while True:
            value = self._kv._internal_kv_get(self.prefix + key, namespace=NAMESPACE)
            if value is not None:
                return value
            if time.monotonic() > deadline:
                raise HcclError("E_TIMEOUT", f"{self.prefix + key!r} was not in Ray's key-value store within "
                                f"{self.timeout_s:g} s (HCCL_CONNECT_TIMEOUT)")
            time.sleep(_POLL_S)

    def add(self, key: str, amount: int) -> int:
        """The counter's value after adding `amount` (>= 0). The KV has no atomic increment, but
        an insert that refuses an existing key is one: a unit is a key of its own, claimed by
        insertion, and the count is how many there are."""
        base = f"{self.prefix}{key}#"
        count = len(self._kv._internal_kv_list(base, namespace=NAMESPACE))
        for _ in range(amount):
            while self._kv._internal_kv_put(f"{base}{count}", b"1", overwrite=False, namespace=NAMESPACE):
                count += 1               # taken by a peer in the meantime: the next one
            count += 1
        return count

    def delete(self, key: str) -> None:
        self._kv._internal_kv_del(self.prefix + key, namespace=NAMESPACE)

    def delete_all(self) -> None:
        self._kv._internal_kv_del(self.prefix, del_by_prefix=True, namespace=NAMESPACE)


def group_prefix(name: str) -> str:
    """Where a group's keys live: the Ray job's (the driver that made the actors), then its name."""
    import ray
    return f"collective/{ray.get_runtime_context().get_job_id()}/{name}/"


def meet(name: str, rank: int, size: int, topo, config):
    """This rank's engines.torchrun.Launched for the group `name` (see the module's docstring)."""
    import ray
    from ..torchrun import connect
    timeout_s = float(config.connect_timeout_s)
    named = KVStore(group_prefix(name), timeout_s)
    if rank == 0:
        from hcomm.memory import segments as shm
        shm.sweep_orphans()              # what groups left on this host when Ray killed their actors
        incarnation = uuid.uuid4().hex
        named.set("incarnation", incarnation)
    else:
        try:
            incarnation = named.get("incarnation").decode()
        except HcclError as exc:
            raise HcclError("E_TIMEOUT", f"rank {rank} of collective group {name!r}: rank 0 did not start the group: "
                            f"{exc.reason}", rank=rank) from None
    store = KVStore(f"{named.prefix}{incarnation}/", timeout_s)
    try:
        ctx = ray.get_runtime_context()
        store.set(f"node/{rank}", ctx.get_node_id())
        try:
            nodes = [store.get(f"node/{r}").decode() for r in range(size)]
        except HcclError as exc:
            raise HcclError("E_TIMEOUT", f"rank {rank} of collective group {name!r}: not every rank of {size} "
                            f"joined: {exc.reason}", rank=rank) from None
        local = len(set(nodes)) == 1
        launched = connect(store, rank, size, topo, config=config, local=local, node=nodes[rank],
                           host=None if local else ray.util.get_node_ip_address())
    except BaseException:
        store.delete_all()               # this incarnation cannot complete without this rank
        raise
    finally:
        if rank == 0:
            named.delete("incarnation")
    if store.add("connected", 1) == size:
        store.delete_all()
    return launched
