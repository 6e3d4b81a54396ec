"""Point-to-point operations of the Communicator: send, recv and HcclBatchSendRecv.

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
starts when it is ready and the rank's previous receive has finished.
"""
from __future__ import annotations

import numpy as np

from hcomm.cost import as_cost
from hcomm.link_state import LinkFailure
from topologies.errors import Cause, HcclError

from ..config.types import dtype_name, numpy_dtype
from ..faults.retry import exception_location, failure_fields, level_of
from ..plan.costs import effective_cost
from .record import OpRecord

BATCH_TAG = ("batch",)          # a channel of its own: a batch never takes a tagged send's data
KINDS = ("send", "recv")


def priced_receive(comm, src: int, msg, nbytes: int, start: int, op: str, call_ns=None) -> int:
    """This rank's exit clock from one receive of `nbytes` from `src` (`msg` from the transport,
    its meta the sender's clock), the sender told its own by the reply; E_REMOTE on both ends
    when the transfer's retransmissions run out under a fault plan."""
    before = comm._p2p_received.get(src, 0)
    comm._p2p_received[src] = before + 1
    progress = comm._group.fault_progress
    cost, crc = comm.cost, None
    if progress is not None:
        crc = progress.p2p_crc(src, comm.rank, before)
        if progress.backup:
            cost = effective_cost(comm.topology, comm.config, progress.backup)
    try:
        end, send_end = cost.p2p_ns(src, comm.rank, nbytes, msg.meta, start, crc=crc, call_ns=call_ns)
    except LinkFailure as f:
        level = level_of(cost, src, comm.rank)
        reason = f"{exception_location(f, 'send/recv', 'p2p', level)}; HCCL has no op retry for send/recv"
        facts = {"cause": Cause.LINK_FAILED, **failure_fields(f, level)}
        msg.consumed(reply=[f.time_ns, reason, facts])        # plain values: every transport carries them
        comm.device.clock = max(comm.device.clock, f.time_ns)
        raise HcclError("E_REMOTE", reason, rank=comm.rank, op=op, **facts) from None
    msg.consumed(reply=send_end)
    return end


def sender_exit(comm, reply, op: str) -> int:
    """The sender's exit clock from the receiver's reply (E_REMOTE if the transfer failed)."""
    if isinstance(reply, (list, tuple)):             # [clock, reason, fields(, code)]: the transfer failed
        comm.device.clock = max(comm.device.clock, int(reply[0]))
        raise HcclError(reply[3] if len(reply) > 3 else "E_REMOTE", reply[1], rank=comm.rank, op=op,
                        **(reply[2] if len(reply) > 2 else {}))
    return int(reply)


class Item:
    """One checked item of a batch: its kind, peer, and array (a receive's buffer to fill)."""
    __slots__ = ("index", "kind", "peer", "array")

    def __init__(self, index, kind, peer, array):
        self.index, self.kind, self.peer, self.array = index, kind, peer, array


def checked_items(comm, items, any_size: bool = False) -> list:
    """The batch's items, each (kind, peer, array): "send" with the array to send, "recv" with the
    array to receive into or (shape, dtype) of a fresh one (`any_size`: or None, an array of what
    arrives, as a group's receive); E_PARA naming the item otherwise."""
    op = "batch_send_recv"
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise HcclError("E_PARA", f"items must be a list of (kind, peer, array) items, got {type(items).__name__}",
                        rank=comm.rank, op=op, cause=Cause.BAD_INPUT)
    out = []
    for k, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) != 3 or item[0] not in KINDS:
            raise HcclError("E_PARA", f"items[{k}] must be (\"send\" or \"recv\", peer, array), got {item!r}",
                            rank=comm.rank, op=op, cause=Cause.BAD_INPUT)
        kind, peer, arr = item
        if not isinstance(peer, (int, np.integer)) or isinstance(peer, bool) or not 0 <= peer < comm.size:
            raise HcclError("E_PARA", f"items[{k}]: peer must be a rank in [0, {comm.size}), got {peer!r}",
                            rank=comm.rank, op=op, cause=Cause.BAD_INPUT)
        if kind == "recv" and arr is None and any_size:
            pass
        elif kind == "recv" and isinstance(arr, tuple) and len(arr) == 2 and not isinstance(arr[0], np.ndarray):
            shape, dtype = arr
            try:
                arr = np.empty(tuple(shape), dtype=numpy_dtype(dtype_name(np.dtype(dtype))))
            except (TypeError, ValueError, HcclError):
                raise HcclError("E_PARA", f"items[{k}]: a receive's (shape, dtype) must name an array, got {item[2]!r}",
                                rank=comm.rank, op=op, cause=Cause.BAD_INPUT) from None
        else:
            arr = comm._array(arr, op)
            if kind == "recv" and not arr.flags.writeable:
                raise HcclError("E_PARA", f"items[{k}]: the receive buffer is read-only", rank=comm.rank, op=op,
                                cause=Cause.BAD_INPUT)
        out.append(Item(k, kind, int(peer), arr))
    return out


def pairwise_order(items, rank: int, p: int) -> tuple:
    """(sends, receives) in HCCL's order (stable within a peer), and the self pairs, checked."""
    sends = sorted((i for i in items if i.kind == "send"), key=lambda i: (rank - i.peer) % p)
    recvs = sorted((i for i in items if i.kind == "recv"), key=lambda i: (i.peer - rank) % p)
    own_s = [i for i in sends if i.peer == rank]
    own_r = [i for i in recvs if i.peer == rank]
    if len(own_s) != len(own_r) or any(r.array is not None and (s.array.size != r.array.size
                                                                 or s.array.dtype != r.array.dtype)
                                       for s, r in zip(own_s, own_r)):
        raise HcclError("E_PARA", f"sends to rank {rank} itself ({len(own_s)}) and receives from it ({len(own_r)}) do "
                        "not pair one to one with equal counts and dtypes (HCCL: \"SendTask and Recv Task to rank "
                        "itself do not match\")", rank=rank, op="batch_send_recv", cause=Cause.BAD_INPUT)
    return ([i for i in sends if i.peer != rank], [i for i in recvs if i.peer != rank], list(zip(own_s, own_r)))


def batch_send_recv(comm, items, any_size: bool = False) -> list:
    """HcclBatchSendRecv on `comm`: every item's transfer; the receive buffers, in item order.
    `any_size`: receives may be None, an array of whatever the peer sends (a group's)."""
    op = "batch_send_recv"
    comm._check_usable(op)
    checked = checked_items(comm, items, any_size)
    sends, recvs, own = pairwise_order(checked, comm.rank, comm.size)
    dev, transport = comm.device, comm._transport
    queue = dev.default_stream                  # HCCL launches the batch on a stream, after what it holds
    start = max(dev.clock, queue.tail)
    call = start + comm.cost.device_model.p2p_overhead_ns          # one launch for the whole batch
    posted, ready = [], call
    plain = as_cost(comm.topology)          # a send stream's estimate: the route as if nothing failed
    for item in sends:
        data = np.ascontiguousarray(item.array)
        meta = (ready, item.index, dtype_name(data.dtype), data.size)
        posted.append((item, transport.post_view(comm.rank, item.peer, BATCH_TAG, data, meta=meta)))
        comm._p2p_sent[item.peer] = comm._p2p_sent.get(item.peer, 0) + 1
        ready = plain.p2p_ns(comm.rank, item.peer, data.nbytes, ready, ready, call_ns=0)[1]
    for s, r in own:
        if r.array is None:
            r.array = s.array.copy()
        np.copyto(r.array.reshape(-1), s.array.reshape(-1))
    clock = call + sum(comm.cost.device_model.copy_ns(s.array.nbytes) for s, _ in own)
    for item in recvs:
        msg = transport.take(item.peer, comm.rank, BATCH_TAG, transport.deadline(), op)
        sent_at, index, dtype, size = msg.meta
        if item.array is None:
            item.array = np.empty(np.shape(msg.data), dtype=np.asarray(msg.data).dtype)
        if size != item.array.size or dtype != dtype_name(item.array.dtype):
            reason = (f"rank {comm.rank} receives {item.array.size} elements of {dtype_name(item.array.dtype)} from "
                      f"rank {item.peer} (items[{item.index}]), which sends {size} of {dtype} (its items[{index}])")
            msg.consumed(reply=[clock, reason, {"cause": Cause.BAD_INPUT}, "E_PARA"])
            raise HcclError("E_PARA", reason, rank=comm.rank, op=op, cause=Cause.BAD_INPUT, peers=(item.peer,))
        np.copyto(item.array.reshape(-1), np.asarray(msg.data).reshape(-1))
        msg.meta = sent_at
        clock = priced_receive(comm, item.peer, msg, item.array.nbytes, clock, op, call_ns=0)
    end = clock
    for item, msg in posted:
        end = max(end, sender_exit(comm, transport.wait_consumed(msg, transport.deadline(), op), op))
    dev.clock = queue.tail = max(end, ready)
    queue.tasks.append((op, start, dev.clock))
    nbytes = sum(i.array.nbytes for i in checked if i.kind == "send")
    comm.last_op = OpRecord(op, "pairwise", nbytes, sum(i.array.size for i in checked), "mixed" if len(
        {i.array.dtype for i in checked}) > 1 else (dtype_name(checked[0].array.dtype) if checked else "uint8"), start,
        dev.clock)
    return [i.array for i in checked if i.kind == "recv"]
