"""Point-to-point operations of the Communicator: send, recv and HcclBatchSendRecv, planned and
priced here; their bytes move in hcomm (hcomm.exec.p2p: posts, takes, copies, replies).

Every transfer is priced by its receiver (CostModel.p2p_ns) from the sender's clock, which
travels with the data, and the receiver's; the receiver replies with the sender's exit clock, or
with the error CQE that ended the transfer (past its retransmissions under a fault plan: E_REMOTE
on both ends, HCCL has no op retry for send/recv).

BatchSendRecv (HCCL's CollBatchSendRecvExecutor): a rank's sends and receives, issued as one op.
HCCL orders them pairwise (GetPairWiseList): sends to the nearest rank at or below this one
first, going down the ring ((rank - peer) mod p), receives from the nearest at or above it
first, going up ((peer - rank) mod p), each kind in its own stream; a rank's sends to itself pair
one to one with its receives from itself and are local copies. Here every send is posted at
once and the receives are taken in HCCL's order, so no batch whose pairs match can deadlock;
each stream runs its transfers one after another in simulated time: a send is ready when the
sender's previous send would have finished (as if its receiver had been waiting), a receive
starts when it is ready and the rank's previous receive has finished. An item is a `Send` or a
`Recv`, told apart by its class from the user's ("send" | "recv", peer, array) once, at the check.
"""
from __future__ import annotations

import numpy as np

from hcomm.cost import as_cost
from hcomm.exec.p2p import copy_local
from hcomm.link_state import LinkFailure
from topologies.errors import Cause, HcclError

from ..config.types import dtype_name, numpy_dtype
from ..faults.retry import exception_location, failure_fields, level_of
from ..plan.costs import effective_cost
from .record import OpRecord, note_p2p

BATCH_TAG = ("batch",)          # a channel of its own: a batch never takes a tagged send's data


def priced_receive(comm, arrived, nbytes: int, start: int, op: str, call_ns=None, sent_at=None) -> int:
    """This rank's exit clock from one receive of `nbytes` (`arrived`, hcomm's, its meta the
    sender's clock unless `sent_at` says it), the sender told its own by the reply; E_REMOTE on
    both ends when the transfer's retransmissions run out under a fault plan."""
    src = arrived.source
    before = comm._p2p_received.get(src, 0)
    comm._p2p_received[src] = before + 1
    progress = comm._group.fault_progress
    cost, crc = comm.cost, None
    if progress is not None:
        crc = progress.p2p_crc(src, comm.rank, before)
        if progress.backup:
            cost = effective_cost(comm.topology, comm.config, progress.backup)
    try:
        end, send_end = cost.p2p_ns(src, comm.rank, nbytes, arrived.meta if sent_at is None else sent_at, start,
                                    crc=crc, call_ns=call_ns)
    except LinkFailure as f:
        level = level_of(cost, src, comm.rank)
        reason = f"{exception_location(f, 'send/recv', 'p2p', level)}; HCCL has no op retry for send/recv"
        facts = {"cause": Cause.LINK_FAILED, **failure_fields(f, level)}
        arrived.reply([f.time_ns, reason, facts])
        comm.device.clock = max(comm.device.clock, f.time_ns)
        raise HcclError("E_REMOTE", reason, rank=comm.rank, op=op, **facts) from None
    arrived.reply(send_end)
    return end


def sender_exit(comm, reply, op: str) -> int:
    """The sender's exit clock from the receiver's reply (E_REMOTE if the transfer failed)."""
    if isinstance(reply, (list, tuple)):             # [clock, reason, fields(, code)]: the transfer failed
        comm.device.clock = max(comm.device.clock, int(reply[0]))
        raise HcclError(reply[3] if len(reply) > 3 else "E_REMOTE", reply[1], rank=comm.rank, op=op,
                        **(reply[2] if len(reply) > 2 else {}))
    return int(reply)


class Item:
    """One checked item of a batch: its index in the batch, peer, and array (a receive's buffer
    to fill, or None: an array of what arrives). `Item.of(index, kind, peer, array)` makes a
    Send or a Recv from the user's kind."""
    __slots__ = ("index", "peer", "array")
    sends = False

    def __init__(self, index, peer, array):
        self.index, self.peer, self.array = index, peer, array

    @staticmethod
    def of(index, kind, peer, array) -> "Item":
        return KINDS[kind](index, peer, array)

    def result(self):
        """What the item gives the caller once the batch has run (a group's Pending)."""
        return None


class Send(Item):
    __slots__ = ()
    sends = True


class Recv(Item):
    __slots__ = ()

    def result(self):
        return self.array


KINDS = {"send": Send, "recv": Recv}


def _receive_buffer(comm, k, item, arr, any_size):
    """A receive's buffer: the array given (writable), a new one of (shape, dtype), or None (`any_size`)."""
    op = "batch_send_recv"
    if arr is None and any_size:
        return None
    if isinstance(arr, tuple) and len(arr) == 2 and not isinstance(arr[0], np.ndarray):
        shape, dtype = arr
        try:
            return np.empty(tuple(shape), dtype=numpy_dtype(dtype_name(np.dtype(dtype))))
        except (TypeError, ValueError, HcclError):
            raise HcclError("E_PARA", f"items[{k}]: a receive's (shape, dtype) must name an array, got {item[2]!r}",
                            rank=comm.rank, op=op, cause=Cause.BAD_INPUT) from None
    arr = comm._array(arr, op)
    if not arr.flags.writeable:
        raise HcclError("E_PARA", f"items[{k}]: the receive buffer is read-only", rank=comm.rank, op=op,
                        cause=Cause.BAD_INPUT)
    return arr


def checked_items(comm, items, any_size: bool = False) -> list:
    """The batch's items as Sends (with the array to send) and Recvs (with the array to receive
    into, a fresh one for (shape, dtype), or with `any_size` None: an array of what arrives, as a
    group's receive); E_PARA naming the item otherwise."""
    op = "batch_send_recv"
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise HcclError("E_PARA", f"items must be a list of (kind, peer, array) items, got {type(items).__name__}",
                        rank=comm.rank, op=op, cause=Cause.BAD_INPUT)
    out = []
    for k, item in enumerate(items):
        kind = KINDS.get(item[0]) if isinstance(item, (tuple, list)) and len(item) == 3 \
            and isinstance(item[0], str) else None
        if kind is None:
            raise HcclError("E_PARA", f"items[{k}] must be (\"send\" or \"recv\", peer, array), got {item!r}",
                            rank=comm.rank, op=op, cause=Cause.BAD_INPUT)
        _, peer, arr = item
        if not isinstance(peer, (int, np.integer)) or isinstance(peer, bool) or not 0 <= peer < comm.size:
            raise HcclError("E_PARA", f"items[{k}]: peer must be a rank in [0, {comm.size}), got {peer!r}",
                            rank=comm.rank, op=op, cause=Cause.BAD_INPUT)
        arr = comm._array(arr, op) if kind.sends else _receive_buffer(comm, k, item, arr, any_size)
        out.append(kind(k, int(peer), arr))
    return out


def pairwise_order(items, rank: int, p: int) -> tuple:
    """(sends, receives) in HCCL's order (stable within a peer), and the self pairs, checked."""
    sends = sorted((i for i in items if i.sends), key=lambda i: (rank - i.peer) % p)
    recvs = sorted((i for i in items if not i.sends), key=lambda i: (i.peer - rank) % p)
    own_s = [i for i in sends if i.peer == rank]
    own_r = [i for i in recvs if i.peer == rank]
    if len(own_s) != len(own_r) or any(r.array is not None and (s.array.size != r.array.size
                                                                 or s.array.dtype != r.array.dtype)
                                       for s, r in zip(own_s, own_r)):
        raise HcclError("E_PARA", f"sends to rank {rank} itself ({len(own_s)}) and receives from it ({len(own_r)}) do "
                        "not pair one to one with equal counts and dtypes (HCCL: \"SendTask and Recv Task to rank "
                        "itself do not match\")", rank=rank, op="batch_send_recv", cause=Cause.BAD_INPUT)
    return ([i for i in sends if i.peer != rank], [i for i in recvs if i.peer != rank], list(zip(own_s, own_r)))


def batch_send_recv(comm, items) -> list:
    """HcclBatchSendRecv on `comm`: every item's transfer; the receive buffers, in item order."""
    return [i.array for i in run_batch(comm, items) if not i.sends]


def run_batch(comm, items, any_size: bool = False) -> list:
    """The batch's transfers; its checked items, in item order, each Recv's array filled.
    `any_size`: receives may be None, an array of whatever the peer sends (a group's)."""
    op = "batch_send_recv"
    comm._check_usable(op)
    checked = checked_items(comm, items, any_size)
    sends, recvs, own = pairwise_order(checked, comm.rank, comm.size)
    dev, endpoint = comm.device, comm._p2p
    queue = dev.default_stream                  # HCCL launches the batch on a stream, after what it holds
    start = max(dev.clock, queue.tail)
    call = start + comm.cost.device_model.p2p_overhead_ns          # one launch for the whole batch
    posted, ready = [], call
    plain = as_cost(comm.topology)          # a send stream's estimate: the route as if nothing failed
    for item in sends:
        data = item.array
        meta = (ready, item.index, dtype_name(data.dtype), data.size)
        posted.append((item, endpoint.post(item.peer, BATCH_TAG, data, meta)))
        comm._p2p_sent[item.peer] = comm._p2p_sent.get(item.peer, 0) + 1
        ready = plain.p2p_ns(comm.rank, item.peer, data.nbytes, ready, ready, call_ns=0)[1]
    for s, r in own:
        r.array = copy_local(s.array, r.array)
    clock = call + sum(comm.cost.device_model.copy_ns(s.array.nbytes) for s, _ in own)
    for item in recvs:
        arrived = endpoint.take(item.peer, BATCH_TAG, op)
        sent_at, index, dtype, size = arrived.meta
        if item.array is not None and (size != item.array.size or dtype != dtype_name(item.array.dtype)):
            reason = (f"rank {comm.rank} receives {item.array.size} elements of {dtype_name(item.array.dtype)} from "
                      f"rank {item.peer} (items[{item.index}]), which sends {size} of {dtype} (its items[{index}])")
            arrived.reply([clock, reason, {"cause": Cause.BAD_INPUT}, "E_PARA"])
            raise HcclError("E_PARA", reason, rank=comm.rank, op=op, cause=Cause.BAD_INPUT, peers=(item.peer,))
        item.array = arrived.copy() if item.array is None else arrived.copy_into(item.array)
        clock = priced_receive(comm, arrived, item.array.nbytes, clock, op, call_ns=0, sent_at=sent_at)
    end = clock
    for item, handle in posted:
        end = max(end, sender_exit(comm, endpoint.wait_delivered(handle, op), op))
    dev.clock = queue.tail = max(end, ready)
    queue.tasks.append((op, start, dev.clock))
    nbytes = sum(i.array.nbytes for i in checked if i.sends)
    note_p2p(comm, OpRecord(op, "pairwise", nbytes, sum(i.array.size for i in checked), "mixed" if len(
        {i.array.dtype for i in checked}) > 1 else (dtype_name(checked[0].array.dtype) if checked else "uint8"), start,
        dev.clock))
    return checked
