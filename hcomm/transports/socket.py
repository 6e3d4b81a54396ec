"""Socket transport: direct TCP connections between ranks, peer to peer, no hub.

Each rank's endpoint listens on a port of its own (`address`); the caller exchanges the addresses
(its bootstrap: a dict rank -> (host, port), or a callable) and calls `start(peers)`, which
connects to every peer within HCCL_CONNECT_TIMEOUT (`eager=True`, the default) or lets the first
send to a peer connect (`eager=False`).

One connection per ordered pair (a -> b), opened by a: it carries a's data frames to b and b's
acknowledgements back, so neither end ever has to decide who connects. A frame is a fixed prefix
(kind, header length, payload length), a small JSON header (message id, tag, dtype, shape, meta)
and the payload's raw bytes: sent from the slice's own memory with sendmsg (no copy, no pickle),
received with recv_into straight into a numpy array of the right shape. Per outgoing connection a
sender thread writes the frames that `post` queues (so `post` never blocks and a step's sends to
different peers overlap) and a reader thread completes handles from acknowledgements; per incoming
connection a reader thread demultiplexes data frames by (src, tag) into the endpoint's inbox
(the frames themselves: hcomm.transports.frames).

A rank that closes says so first, with a BYE frame on each of its connections after what it sent
there: waits on it then fail with E_PARA ("returned without ..."), a wait for data once the data
connection's BYE is in, a wait for an acknowledgement once the other's is. A connection that breaks without one (the peer's process died) fails every wait on
that peer with E_REMOTE naming it. A watched peer (PeerEndpoint.watch_peer) gets a connection at
once if it has none, so that its death is seen even by a rank that never exchanged with it; a
watched peer refusing a connection is gone (every endpoint listens before its run starts).
Tags and meta must be JSON values (tags may be tuples).

Peers on this rank's own host (`share_host(memory, ranks)`: the Ray engine's ranks of one node, a
torchrun host's) read in place what lies in shared memory: a data frame to one of them is the
slice's place in this rank's segments (hcomm.memory.segment_provider), a record in the peer's
shared-memory ring that the peer's own thread reads when it wakes on its doorbell, and the peer
reduces or copies straight from the slice, as HCCL's zero-copy peers do; its acknowledgement
comes back the same way (hcomm.transports.same_host). The world communicator's ops need not even
that: their ranks of one host read each other's slices where they lie, in step by words in shared
memory (`host_steps`, hcomm.exec.hosted). Slices elsewhere, and every peer on another host, travel
as bytes over TCP; a waiting rank sleeps on its doorbell, which the socket threads ring as they
deliver.
"""
from __future__ import annotations

import socket
import threading
import time

import numpy as np

from topologies.errors import HcclError

from ..memory import segments

from .base import POLL_S, connect_timeout, peer_lost
from .frames import ACK, BYE, DATA, HELLO, Link as _Link, encode, raw_bytes, read_frame, recv_into, tune
from .peer import PeerEndpoint, RemoteMessage, dtype_from_wire, json_tuples as _tuples, wire_dtype
from .same_host import BellCondition, PairOrder, SameHost

_JOIN_S = 5.0
_POOL_PER_SHAPE = 4      # consumed receive buffers kept per (shape, dtype) for reuse
INLINE_SEND_BYTES = 64 << 10   # payloads up to this leave from the posting thread (they fit the socket buffer)
_REFUSED = "it refuses connections (its process is gone)"


class SocketTransport(PeerEndpoint):
    """One rank's endpoint: listens at once; `start(peers)` joins it to the others."""

    plane = "socket"

    def __init__(self, rank: int, size: int, timeout_s: float | None = None, connect_timeout_s: float = 120.0,
                 host: str = "127.0.0.1", port: int = 0):
        super().__init__(rank, size, timeout_s)
        self.cond = BellCondition(threading.Lock())   # no thread uses the endpoint's yet
        self.arrivals = PairOrder()        # data frames to and from peers on this host, numbered
        self._host = None                # share_host: the rings to those peers
        if not connect_timeout_s or connect_timeout_s <= 0:
            raise HcclError("E_PARA", f"connect_timeout_s must be > 0, got {connect_timeout_s!r}", rank=self.rank)
        self.connect_timeout_s = float(connect_timeout_s)
        try:
            self._listener = socket.create_server((host, port), backlog=max(16, 2 * self.size))
        except OSError as exc:
            raise HcclError("E_TCP_CONNECT", f"cannot listen on {host}:{port}: {exc}", rank=self.rank) from None
        self._listener.settimeout(POLL_S * 4)
        self.address = (host, self._listener.getsockname()[1])
        self._peers = None
        self._outgoing, self._incoming = {}, {}
        self._links_cond = threading.Condition()
        self._connect_lock = threading.Lock()
        self._said_bye = False
        self._acks_after_bye = set()     # peers whose acknowledgements end with their own connection's BYE
        self._pool, self._pool_lock = {}, threading.Lock()
        self._memory, self._same_host = None, frozenset()     # share_host
        self.sent_by_place = 0           # data frames that carried a slice's place, not its bytes
        self.sent_by_ring = 0            # of those, the ones that went by the host's rings
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True, name=f"hcomm-sock{self.rank}-accept")
        self._acceptor.start()

    # bootstrap ---------------------------------------------------------------------------------------
    def start(self, peers, eager: bool = True) -> None:
        """`peers`: rank -> (host, port) for every rank (a mapping or a callable). With `eager`,
        connect to every peer and wait until every peer has connected back, within the connect
        timeout; E_TIMEOUT naming the ranks that did not."""
        self._peers = peers
        if not eager:
            return
        for peer in range(self.size):
            if peer != self.rank:
                self._link_to(peer)
        deadline = time.monotonic() + self.connect_timeout_s
        with self._links_cond:
            while len(self._incoming) < self.size - 1 and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(self.size)) - set(self._incoming) - {self.rank})
                    raise connect_timeout(missing[0], self.rank, self.connect_timeout_s,
                                          f"ranks {missing} never connected to this rank")
                self._links_cond.wait(min(POLL_S, left))

    def asleep_on_doorbell(self) -> int:
        """How many threads of this rank sleep on its same-host doorbell now (0 without host peers):
        what a caller that is about to wake them can wait for."""
        host = self._host
        return 0 if host is None else host.rings.sleepers()

    def share_host(self, memory, ranks) -> None:
        """Send `ranks` (peers on this host) the places of slices that lie in `memory`'s segments
        (a SegmentProvider: `where`, `peer_view`, `session`), and read theirs in place; places and
        their acknowledgements go through shared-memory rings (hcomm.transports.same_host)."""
        self._memory, self._same_host = memory, frozenset(int(r) for r in ranks) - {self.rank}
        if self._same_host and self._host is None:
            prefix = f"{segments.PREFIX}{memory.session}"
            self._host = SameHost(self, memory, self._same_host | {self.rank},
                                  lambda r: f"{prefix}_{r}_rings_{self._address_of(r)[1]}")
            self.cond.bell = self._host.rings.ring_self

    def _address_of(self, peer):
        if self._peers is None:
            raise HcclError("E_INTERNAL", "start(peers) was not called: no address for any peer", rank=self.rank)
        try:
            host, port = self._peers(peer) if callable(self._peers) else self._peers[peer]
            return str(host), int(port)
        except HcclError:
            raise
        except Exception as exc:
            raise HcclError("E_PARA", f"no address for rank {peer} in the bootstrap: {type(exc).__name__}: {exc}",
                            rank=self.rank) from None

    def _link_to(self, peer) -> _Link:
        link = self._outgoing.get(peer)
        if link is not None:
            return link
        with self._connect_lock:
            link = self._outgoing.get(peer)
            if link is None:
                link = self._connect(peer)
        return link

    def _connect(self, peer) -> _Link:
        address = self._address_of(peer)
        deadline = time.monotonic() + self.connect_timeout_s
        delay, last = 0.01, None
        while True:
            self._abort.check(self.rank, "connect")
            if peer in self._down:
                raise peer_lost(peer, self.rank, self._down[peer], "connect")
            left = deadline - time.monotonic()
            if left <= 0:
                raise connect_timeout(peer, self.rank, self.connect_timeout_s, f"{address[0]}:{address[1]}: {last}")
            try:
                sock = socket.create_connection(address, timeout=min(left, 5.0))
                break
            except OSError as exc:       # not listening yet, or refused: retry until the deadline
                last = exc
                if peer in self._watched and isinstance(exc, ConnectionRefusedError):
                    self.peer_down(peer, _REFUSED)     # it listened before the run: its process is gone
                    raise peer_lost(peer, self.rank, _REFUSED, "connect") from None
                time.sleep(min(delay, max(0.0, left)))
                delay = min(delay * 2, 0.5)
        return self._install(peer, sock)

    def _install(self, peer, sock) -> _Link:
        """A connected socket as this rank's outgoing link to `peer`: greet, start its threads."""
        if self._closed:                 # a watch's connect that finished after close()
            sock.close()
            raise HcclError("E_IN_STATUS", f"rank {self.rank}'s socket transport is closed", rank=self.rank)
        sock.settimeout(None)
        tune(sock)
        link = _Link(sock, peer, outgoing=True)
        try:
            link.send(encode(HELLO, {"rank": self.rank, "size": self.size}))
        except OSError as exc:
            sock.close()
            raise peer_lost(peer, self.rank, f"connection refused after connecting: {exc}", "connect") from None
        link.threads = [threading.Thread(target=self._sender, args=(link,), daemon=True, name=f"hcomm-sock{self.rank}-to{peer}"),
                        threading.Thread(target=self._reader, args=(link,), daemon=True, name=f"hcomm-sock{self.rank}-ack{peer}")]
        for t in link.threads:      # started before the link is published: close() joins a published link's
            t.start()               # threads, and joining one not yet started raises
        with self._links_cond:
            self._outgoing[peer] = link
            self._links_cond.notify_all()
        return link

    def _watch(self, peer) -> None:
        """A watched peer's death shows as its connection breaking: open the link to it (on a
        thread of its own, so no wait blocks on the connect) if there is none yet."""
        if peer in self._outgoing or peer in self._down or self._peers is None:
            return
        threading.Thread(target=self._watch_link, args=(peer,), daemon=True,
                         name=f"hcomm-sock{self.rank}-watch{peer}").start()

    def _watch_link(self, peer) -> None:
        try:
            self._link_to(peer)
        except HcclError as exc:
            if not self._closed:
                self.peer_down(peer, f"no connection: {exc.reason}")

    def _accept_loop(self):
        while not self._closed:
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._greet, args=(sock,), daemon=True, name=f"hcomm-sock{self.rank}-greet").start()

    def _greet(self, sock):
        """Read a new connection's HELLO; then it is this rank's incoming link from that peer."""
        try:
            sock.settimeout(self.connect_timeout_s)
            kind, head, _ = read_frame(sock)
            peer = head.get("rank")
            if kind != HELLO or head.get("size") != self.size or not isinstance(peer, int) \
                    or not 0 <= peer < self.size or peer == self.rank:
                raise ValueError(f"bad greeting {head!r}")
            sock.settimeout(None)
            tune(sock)
        except (OSError, ValueError, EOFError):
            sock.close()                 # not one of ours: ignore it
            return
        link = _Link(sock, peer, outgoing=False)
        link.threads = [threading.current_thread()]
        with self._links_cond:
            if self._closed or peer in self._incoming:
                sock.close()
                return
            self._incoming[peer] = link
            self._links_cond.notify_all()
        self._reader(link)

    # the threads of a link ---------------------------------------------------------------------------
    def _sender(self, link):
        while True:
            parts = link.queue.get()
            if parts is None:
                return
            try:
                link.sent_by_thread(parts)
            except OSError as exc:
                self.peer_down(link.peer, f"connection broke while sending to it: {exc}")
                return

    def _reader(self, link):
        """Data frames on an incoming link, acknowledgements on an outgoing one; BYE on both."""
        peer, sock, bye = link.peer, link.sock, False
        try:
            while True:
                kind, head, nbytes = read_frame(sock)
                if kind == DATA:
                    if "seg" in head:    # a slice of the peer's shared memory, on this host: read in place
                        if self._memory is None or nbytes:
                            raise ValueError("a slice's place from a peer this rank shares no memory with")
                        data = self._memory.peer_view(head["seg"], head["off"], tuple(head["shape"]),
                                                      dtype_from_wire(head["dtype"]))
                    else:
                        data = self._buffer(tuple(head["shape"]), head["dtype"])
                        if data.nbytes != nbytes:
                            raise ValueError(f"payload of {nbytes} bytes for shape {head['shape']} {head['dtype']}")
                        if nbytes:
                            recv_into(sock, raw_bytes(data))
                    self._arrive(peer, head.get("n"), _tuples(head["tag"]), data, head.get("meta"), head["id"])
                elif kind == ACK:
                    self.acknowledged(head["id"], head.get("reply"))
                elif kind == BYE:        # after every frame the peer sent on this connection
                    bye = True
                    self._bye_from(peer, link)
                else:
                    raise ValueError(f"unknown frame kind {kind}")
        except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
            if not bye and not self._closed:
                why = "its connection closed (process died?)" if isinstance(exc, EOFError) else f"{type(exc).__name__}: {exc}"
                self.peer_down(peer, why)

    def _arrive(self, src, n, tag, data, meta, msg_id):
        """A data frame from TCP: numbered (from a peer on this host) -> in its sender's order."""
        msg = RemoteMessage(self, src, tag, data, meta, msg_id)
        with self.cond:
            if n is None:
                self.enqueue_locked(msg)
            else:
                self.arrivals.arrive(src, n, msg, self.enqueue_locked)

    # receive buffers, reused: a fresh array for every message costs page faults on every byte -------
    def _buffer(self, shape, dtype):
        with self._pool_lock:
            free = self._pool.get((shape, dtype))
            if free:
                return free.pop()
        return np.empty(shape, dtype=dtype_from_wire(dtype))

    def _release(self, data):
        if data is None or data.base is not None:
            return
        with self._pool_lock:
            free = self._pool.setdefault((data.shape, wire_dtype(data.dtype)), [])
            if len(free) < _POOL_PER_SHAPE:
                free.append(data)

    # the PeerEndpoint hooks --------------------------------------------------------------------------
    def _send_data(self, handle, view, meta):
        if view.dtype.hasobject or view.dtype.fields is not None:
            raise HcclError("E_PARA", f"a socket transport moves plain numeric arrays, not dtype {view.dtype}",
                            rank=self.rank)
        if handle.dst in self._down:
            raise peer_lost(handle.dst, self.rank, self._down[handle.dst], None)
        link = self._link_to(handle.dst)
        handle.keep = view          # the sender thread (or the peer) reads it: not to be written until the ack
        header = {"id": handle.id, "tag": handle.tag, "dtype": wire_dtype(view.dtype), "shape": view.shape,
                  "meta": meta}
        near = handle.dst in self._same_host
        place = self._memory.where(view) if near and view.nbytes else None
        n = self.arrivals.next(handle.dst) if near else None
        if place is not None and self._host is not None and self._host.send_place(handle, view, meta, place, n):
            self.sent_by_place += 1
            self.sent_by_ring += 1
            return
        if n is not None:
            header["n"] = n
        if place is not None:
            header["seg"], header["off"] = place
            parts = encode(DATA, header)
            self.sent_by_place += 1
        else:
            parts = encode(DATA, header, view)
        if place is not None or view.nbytes <= INLINE_SEND_BYTES:
            try:
                if link.send_now(parts):
                    return
            except OSError as exc:
                self.peer_down(handle.dst, f"connection broke while sending to it: {exc}")
                raise peer_lost(handle.dst, self.rank, self._down[handle.dst], None) from None
        link.enqueue(parts)

    def _send_ack(self, src, msg_id, reply):
        if src in self._same_host and self._host is not None and self._host.send_ack(src, msg_id, reply):
            return
        link = self._incoming.get(src)
        if link is None:
            return
        try:
            link.send(encode(ACK, {"id": msg_id, "reply": reply}))
        except OSError as exc:
            self.peer_down(src, f"connection broke while acknowledging to it: {exc}")

    def _idle(self, timeout, for_acks=False, ready=None):
        if self._host is None:
            self.cond.wait(timeout)
        else:
            self._host.idle(timeout, for_acks, ready)

    @property
    def host_steps(self):
        """The step words of this rank's host peers (hcomm.transports.host_steps), once share_host
        made the rings; else None."""
        return None if self._host is None else self._host.steps

    def _probe(self, peer):
        return self._host.rings.gone(peer) if self._host is not None and peer in self._same_host else None

    def peer_returned(self, peer, data=False, acks=False):
        if self._host is not None:       # what it put in the rings came before its goodbye
            with self.cond:
                self._host.drain()
        super().peer_returned(peer, data, acks)

    def _bye_from(self, peer, link):
        """`peer`'s BYE on `link`: no more data (its connection here) or acknowledgements (this
        rank's connection to it). What it sent on its own connection (an abort notice, say) may
        still be on the way when the BYE on this rank's comes in, so its acknowledgements end
        with both: a wait for them then fails as the notice says, not as a peer that returned."""
        with self._links_cond:          # the two connections' readers decide one after the other
            link.bye = True
            theirs = self._incoming.get(peer)
            if link.outgoing and theirs is not None and not theirs.bye:
                self._acks_after_bye.add(peer)
                return
            acks = link.outgoing or peer in self._acks_after_bye
        self.peer_returned(peer, data=not link.outgoing, acks=acks)

    def _announce_exit(self):
        if self._said_bye:
            return
        self._said_bye = True
        if self._host is not None:
            self._host.steps.leave()
        bye = encode(BYE, {})
        with self._links_cond:
            links = list(self._outgoing.values()) + list(self._incoming.values())
        for link in links:
            if link.outgoing:
                link.enqueue(bye)        # after the data already queued on it
            else:
                try:
                    link.send(bye)
                except OSError:
                    pass

    # shutdown ----------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._announce_exit()
        self.abort("E_INTERNAL", f"rank {self.rank}'s socket transport was closed")
        with self._links_cond:
            links = list(self._outgoing.values()) + list(self._incoming.values())
        for link in links:
            if link.outgoing:
                link.queue.put(None)
        end = time.monotonic() + _JOIN_S
        for link in links:          # let the senders flush their BYE before the sockets go
            if link.outgoing:
                link.threads[0].join(max(0.0, end - time.monotonic()))
        self._closed = True
        for link in links:
            link.shutdown()
        for link in links:
            for t in link.threads:
                if t is not threading.current_thread():
                    t.join(max(0.0, end - time.monotonic()))
            link.sock.close()
        self._acceptor.join(max(0.0, end - time.monotonic()))
        self._listener.close()
        if self._host is not None:
            with self.cond:
                self.cond.bell = None
                self._host.close()
