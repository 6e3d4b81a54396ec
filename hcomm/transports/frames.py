"""The socket transport's frames on the wire, the socket calls that move them, and a connection
with a peer (`Link`: its socket, its frames queued for its sender thread, its threads).

A frame is a fixed prefix (kind, header length, payload length), a small JSON header (message id,
tag, dtype, shape, meta; or a slice's place in shared memory) and the payload's raw bytes: sent
from the slice's own memory with sendmsg (no copy, no pickle), received with recv_into straight
into an array.
"""
from __future__ import annotations

import json
import queue
import socket
import struct
import threading

import numpy as np

from topologies.errors import HcclError

from .peer import json_plain as _plain

_PREFIX = struct.Struct("!BIQ")          # kind, header bytes, payload bytes
HELLO, DATA, ACK, BYE = 1, 2, 3, 4
_MAX_HEADER = 1 << 20
_SOCK_BUF = 4 << 20      # kernel socket buffers: fewer wake-ups per large payload


def encode(kind, header, payload=None) -> list:
    try:
        head = json.dumps(header, default=_plain, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise HcclError("E_PARA", f"a socket transport sends tags and meta as JSON: {exc}") from None
    nbytes = 0 if payload is None else payload.nbytes
    parts = [_PREFIX.pack(kind, len(head), nbytes) + head]
    if nbytes:
        parts.append(raw_bytes(payload))
    return parts


def raw_bytes(array) -> memoryview:
    """A C-contiguous array's bytes as a flat byte view, no copy. Through a uint8 view, not the
    buffer protocol: ml_dtypes' bfloat16 has no buffer format ("cannot include dtype 'E'")."""
    return memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def send_all(sock, parts) -> None:
    """sendmsg until every byte of every part is written (sendmsg may write part of them)."""
    views = [memoryview(p) for p in parts]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def recv_into(sock, view) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("connection closed")
        got += k


def read_frame(sock):
    prefix = bytearray(_PREFIX.size)
    recv_into(sock, memoryview(prefix))
    kind, hlen, nbytes = _PREFIX.unpack(prefix)
    if hlen > _MAX_HEADER:
        raise ValueError(f"frame header of {hlen} bytes: not a peer of this transport")
    head = bytearray(hlen)
    recv_into(sock, memoryview(head))
    return kind, json.loads(head), nbytes


def tune(sock):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)      # acks and small frames go at once
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)      # a vanished host is found too
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, _SOCK_BUF)


class Link:
    """One TCP connection with a peer, and the threads that serve it."""

    def __init__(self, sock, peer, outgoing):
        self.sock, self.peer, self.outgoing = sock, peer, outgoing
        self.send_lock = threading.Lock()
        self.queue = queue.SimpleQueue() if outgoing else None
        self.pending = 0            # frames handed to the sender thread and not yet sent
        self.threads = []
        self.bye = False            # the peer's BYE has come in on it (its last frame there)

    def send(self, parts):
        with self.send_lock:
            send_all(self.sock, parts)

    def enqueue(self, parts):
        """Hand a frame to the link's sender thread (frames leave in the order they were handed)."""
        with self.send_lock:
            self.pending += 1
        self.queue.put(parts)

    def sent_by_thread(self, parts):
        """The sender thread's send of a queued frame."""
        with self.send_lock:
            try:
                send_all(self.sock, parts)
            finally:
                self.pending -= 1

    def send_now(self, parts) -> bool:
        """Send a small frame from the calling thread, saving the hand-off to the sender thread,
        when nothing is queued before it (order is kept); False when it must be queued."""
        if not self.send_lock.acquire(blocking=False):
            return False
        try:
            if self.pending:
                return False
            send_all(self.sock, parts)
            return True
        finally:
            self.send_lock.release()

    def shutdown(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
