"""A delaying TCP relay: the latency of a link, for a kernel without ``netem``.

It runs on the router of :mod:`daskrl.cluster.netns`, where an nftables rule redirects every
TCP connection between two emulated hosts to it; it reads where each was going
(``SO_ORIGINAL_DST``), connects there, and passes the bytes on in both directions, each
chunk ``delay`` seconds after it arrived (chunks of one direction keep their order and
overlap in flight, as on a long link: a stream is delayed, not slowed). Each direction has
two threads, one reading and one writing at the chunk's due time: ``time.sleep`` wakes within
tens of microseconds here, where an event loop's timers round to a millisecond.

Run as ``python -m daskrl.cluster.delay_relay --port 7070 --delay-ms 0.5`` (one-way delay);
it prints ``ready`` once it listens.
"""

from __future__ import annotations

import argparse
import collections
import socket
import struct
import sys
import threading
import time

SO_ORIGINAL_DST = 80
"""``getsockopt`` option (Linux ``netfilter_ipv4.h``) giving a redirected connection's
original destination."""
CHUNK = 1 << 16
"""Bytes read at a time."""
BACKLOG_BYTES = 8 << 20
"""Bytes a direction holds at most before it stops reading (the sender then waits)."""


def original_destination(sock: socket.socket) -> tuple[str, int]:
    """Where a connection that nftables redirected here was going."""
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack("!2xH4s8x", raw)
    return socket.inet_ntoa(packed), port


class Direction:
    """One direction of a relayed connection: chunks read from ``src`` are written to
    ``dst`` ``delay`` seconds after they arrived."""

    def __init__(self, src: socket.socket, dst: socket.socket, delay: float) -> None:
        self.src, self.dst, self.delay = src, dst, delay
        self.chunks: collections.deque[tuple[float, bytes]] = collections.deque()
        self.held = 0
        self.cond = threading.Condition()
        self.closed = False

    def read(self) -> None:
        """Read chunks until the sender closes; an empty chunk marks the end."""
        while True:
            try:
                data = self.src.recv(CHUNK)
            except OSError:
                data = b""
            with self.cond:
                self.cond.wait_for(lambda: self.held < BACKLOG_BYTES or self.closed)
                self.chunks.append((time.monotonic() + self.delay, data))
                self.held += len(data)
                self.cond.notify_all()
            if not data:
                return

    def write(self) -> None:
        """Write each chunk at its due time; at the end, pass the close on."""
        while True:
            with self.cond:
                self.cond.wait_for(lambda: bool(self.chunks))
                due, data = self.chunks[0]
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            with self.cond:
                self.chunks.popleft()
                self.held -= len(data)
                self.cond.notify_all()
            try:
                if not data:
                    self.dst.shutdown(socket.SHUT_WR)
                    return
                self.dst.sendall(data)
            except OSError:
                with self.cond:
                    self.closed = True
                    self.cond.notify_all()
                return


def relay(client: socket.socket, delay: float) -> None:
    """Pass one redirected connection on to where it was going, delayed both ways."""
    try:
        target = original_destination(client)
        upstream = socket.create_connection(target, timeout=10)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    for sock in (client, upstream):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threads = []
    for a, b in ((client, upstream), (upstream, client)):
        d = Direction(a, b, delay)
        threads += [threading.Thread(target=d.read, daemon=True),
                    threading.Thread(target=d.write, daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for sock in (client, upstream):
        sock.close()


def serve(port: int, delay: float) -> None:
    """Accept redirected connections on ``port`` forever, a thread each."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(512)
    print("ready", flush=True)
    while True:
        client, _ = server.accept()
        threading.Thread(target=relay, args=(client, delay), daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """``--port P --delay-ms D``: relay with a one-way delay of D milliseconds."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0,
                        help="one-way delay added to every chunk, in milliseconds")
    args = parser.parse_args(argv)
    serve(args.port, args.delay_ms / 1000.0)


if __name__ == "__main__":
    main(sys.argv[1:])
