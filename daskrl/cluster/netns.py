"""Emulated hosts on one machine: each in a Linux network namespace, joined to a router
namespace by a veth link whose bandwidth is capped (``tc tbf``) and whose latency a delaying
relay adds (:mod:`daskrl.cluster.delay_relay`; this kernel has no ``netem``).

Layout, for ``hosts`` hosts under a name ``prefix``::

    <prefix>-h0  10.199.0.2 --veth-- 10.199.0.1 \\
    <prefix>-h1  10.199.1.2 --veth-- 10.199.1.1  <prefix>-r (router: forwards, and
    ...                                          redirects every TCP connection through
                                                 the relay, one-way delay rtt/2)

Every address lives inside these namespaces; the machine's own network is not touched. A
process runs on host ``i`` under ``ip netns exec <prefix>-h<i>``
(:func:`daskrl.cluster.hosts.host_cluster` takes the namespace of each worker). Creating
namespaces needs root (``CAP_SYS_ADMIN``) and the ``ip``, ``tc`` and ``nft`` commands:
:func:`unavailable` says in one line why they cannot be made here.

Examples
--------
>>> with EmulatedHosts(3, LinkShape(rate_mbit=100, rtt_ms=1)) as hosts:  # doctest: +SKIP
...     print(hosts.namespace(0), hosts.address(0), hosts.measure_rtt(0, 1))
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

SUBNET = "10.199"
"""The first two octets of every emulated address (host ``i`` is ``10.199.i.2``)."""
RELAY_PORT = 7070
"""The relay's port on the router."""


@dataclass(frozen=True)
class LinkShape:
    """What every link between a host and the router is like."""

    rate_mbit: float | None = None
    """Bandwidth cap in Mbit/s, each way (None: as fast as veth goes)."""
    rtt_ms: float = 0.0
    """Round-trip time the relay adds between two hosts (0: no relay, TCP routed
    directly)."""

    def __post_init__(self) -> None:
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise ValueError(f"rate_mbit must be > 0, got {self.rate_mbit}")
        if self.rtt_ms < 0:
            raise ValueError(f"rtt_ms must be >= 0, got {self.rtt_ms}")


def unavailable() -> str | None:
    """Why emulated hosts cannot be made here (None when they can).

    Examples
    --------
    >>> reason = unavailable()
    >>> reason is None or isinstance(reason, str)
    True
    """
    missing = [c for c in ("ip", "tc", "nft") if shutil.which(c) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install iproute2 nftables)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"dkprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add refused: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*cmd: str, ns: str | None = None, stdin: str | None = None) -> None:
    full = ["ip", "netns", "exec", ns, *cmd] if ns else list(cmd)
    done = subprocess.run(full, capture_output=True, text=True, input=stdin)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(full)}: {done.stderr.strip() or done.stdout.strip()}")


def tbf_args(rate_mbit: float) -> list[str]:
    """``tc qdisc ... tbf`` arguments for a cap of ``rate_mbit``: a burst of 1 ms at that rate
    (at least 64 KiB, so a 10 Gbit/s cap is not held back by timer ticks) and 50 ms of queue.

    Examples
    --------
    >>> tbf_args(100)
    ['tbf', 'rate', '100mbit', 'burst', '65536', 'latency', '50ms']
    """
    burst = max(65536, int(rate_mbit * 1e6 / 8 / 1000))
    return ["tbf", "rate", f"{rate_mbit:g}mbit", "burst", str(burst), "latency", "50ms"]


class EmulatedHosts:
    """``hosts`` emulated hosts around a router; a context manager that tears them down.

    Parameters
    ----------
    hosts : int
        How many hosts (namespaces ``<prefix>-h0`` ...).
    shape : LinkShape
        Every link's bandwidth cap and the round trip the relay adds.
    prefix : str, optional
        Namespace names start with it (default: unique to this object).
    """

    def __init__(self, hosts: int, shape: LinkShape = LinkShape(),  # noqa: B008 - frozen
                 prefix: str | None = None) -> None:
        if hosts < 1:
            raise ValueError(f"hosts must be >= 1, got {hosts}")
        self.hosts, self.shape = hosts, shape
        self.prefix = prefix or f"dk{uuid.uuid4().hex[:6]}"
        self.router = f"{self.prefix}-r"
        self.made: list[str] = []
        self.relay: subprocess.Popen[str] | None = None

    def namespace(self, i: int) -> str:
        """The namespace of host ``i``."""
        return f"{self.prefix}-h{i}"

    def address(self, i: int) -> str:
        """The address of host ``i``."""
        return f"{SUBNET}.{i}.2"

    def __enter__(self) -> EmulatedHosts:
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _make(self) -> None:
        r = self.router
        _run("ip", "netns", "add", r)
        self.made.append(r)
        _run("ip", "link", "set", "lo", "up", ns=r)
        _run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", ns=r)
        for i in range(self.hosts):
            h, v = self.namespace(i), f"v{i}"
            _run("ip", "netns", "add", h)
            self.made.append(h)
            _run("ip", "link", "add", "eth0", "netns", h, "type", "veth", "peer", "name", v,
                 "netns", r)
            _run("ip", "link", "set", "lo", "up", ns=h)
            _run("ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0", ns=h)
            _run("ip", "link", "set", "eth0", "up", ns=h)
            _run("ip", "route", "add", "default", "via", f"{SUBNET}.{i}.1", ns=h)
            _run("ip", "addr", "add", f"{SUBNET}.{i}.1/24", "dev", v, ns=r)
            _run("ip", "link", "set", v, "up", ns=r)
            if self.shape.rate_mbit is not None:  # each way: the host's egress, the router's
                for ns, dev in ((h, "eth0"), (r, v)):
                    _run("tc", "qdisc", "add", "dev", dev, "root",
                         *tbf_args(self.shape.rate_mbit), ns=ns)
        if self.shape.rtt_ms > 0:
            rules = (f"table ip dkrelay {{\n chain pre {{\n  type nat hook prerouting priority "
                     f"dstnat;\n  ip protocol tcp redirect to :{RELAY_PORT}\n }}\n}}\n")
            _run("nft", "-f", "-", ns=r, stdin=rules)
            self.relay = subprocess.Popen(
                ["ip", "netns", "exec", r, sys.executable, "-m", "daskrl.cluster.delay_relay",
                 "--port", str(RELAY_PORT), "--delay-ms", str(self.shape.rtt_ms / 2)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert self.relay.stdout is not None
            line = self.relay.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"the delay relay did not start: {line}"
                                   f"{self.relay.stdout.read()[-2000:]}")

    def close(self) -> None:
        """Stop the relay and delete the namespaces made (their links go with them)."""
        if self.relay is not None:
            self.relay.kill()
            self.relay.wait(timeout=10)
            self.relay = None
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made.clear()

    # ------------------------------------------------------------------ measuring
    def _probe(self, i: int, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(["ip", "netns", "exec", self.namespace(i), sys.executable,
                                 "-m", "daskrl.cluster.netns", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def _pair(self, a: int, b: int, *client: str) -> str:
        server = self._probe(b, "serve", self.address(b))
        try:
            assert server.stdout is not None
            port = server.stdout.readline().strip()
            done = self._probe(a, *client[:1], self.address(b), port, *client[1:])
            out, err = done.communicate(timeout=120)
            if done.returncode != 0:
                raise RuntimeError(f"probe {client[0]} failed: {err[-1000:]}")
            return out.strip()
        finally:
            server.kill()
            server.wait(timeout=10)

    def measure_rtt(self, a: int, b: int, count: int = 200) -> float:
        """The median round trip of a 64-byte TCP message from host ``a`` to ``b``, in ms."""
        return float(self._pair(a, b, "rtt", str(count)))

    def measure_rate(self, a: int, b: int, megabytes: int = 32) -> float:
        """What a ``megabytes`` TCP transfer from host ``a`` to ``b`` achieves, in Mbit/s."""
        return float(self._pair(a, b, "rate", str(megabytes)))


# ---------------------------------------------------------------------- probes (a host's side)
def _serve(host: str) -> None:
    """Echo what each connection sends (the ``serve`` probe); prints the port first."""
    server = socket.socket()
    server.bind((host, 0))
    server.listen(4)
    print(server.getsockname()[1], flush=True)
    while True:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := conn.recv(1 << 16):
            conn.sendall(data[:64])  # the rate probe reads a short reply only
        conn.close()


def _rtt(host: str, port: str, count: str) -> None:
    with socket.create_connection((host, int(port))) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(int(count)):
            t0 = time.perf_counter()
            conn.sendall(b"x" * 64)
            got = 0
            while got < 64:
                got += len(conn.recv(64 - got))
            times.append(time.perf_counter() - t0)
    print(1000 * statistics.median(times[len(times) // 10:]))


def _rate(host: str, port: str, megabytes: str) -> None:
    block = b"x" * (1 << 20)
    with socket.create_connection((host, int(port))) as conn:
        t0 = time.perf_counter()
        for _ in range(int(megabytes)):
            conn.sendall(block)
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(1 << 16):
            pass
        elapsed = time.perf_counter() - t0
    print(int(megabytes) * 8 * (1 << 20) / 1e6 / elapsed)


if __name__ == "__main__":
    {"serve": _serve, "rtt": _rtt, "rate": _rate}[sys.argv[1]](*sys.argv[2:])
