"""``SSHCluster`` for real: an sshd on 127.0.0.1 (its own config, host and user keys made here,
a free port), a scheduler and two workers started over SSH as on other machines, and PPO
trained on them through a ``Client``. Skips, saying why, without openssh-server or asyncssh."""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client

from daskrl.cluster.local import worker_resources
from daskrl.distributions import get_distribution
from daskrl.runtime.driver import RunSettings, train

pytestmark = pytest.mark.timeout(300)

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """An sshd on 127.0.0.1 that lets this user in with a key made here; killed by PID."""
    if not os.path.exists(SSHD):
        pytest.skip("sshd not installed (apt-get install openssh-server)")
    asyncssh = pytest.importorskip("asyncssh", reason="SSHCluster needs asyncssh")
    del asyncssh
    home = tmp_path_factory.mktemp("sshd")
    _keygen(home / "host_key")
    _keygen(home / "user_key")
    (home / "authorized_keys").write_text((home / "user_key.pub").read_text())
    port = _free_port()
    config = home / "sshd_config"
    config.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {home / 'host_key'}
PidFile {home / 'sshd.pid'}
AuthorizedKeysFile {home / 'authorized_keys'}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
""")
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    log = (home / "sshd.log").open("w")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.skip(f"sshd did not start: {(home / 'sshd.log').read_text()[-500:]}")
                time.sleep(0.1)
        yield {"port": port, "key": str(home / "user_key"), "user": getpass.getuser()}
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def ssh_client(sshd: dict) -> Iterator[Client]:
    from distributed import SSHCluster

    connect = {"port": sshd["port"], "client_keys": [sshd["key"]], "known_hosts": None,
               "username": sshd["user"]}
    with SSHCluster(["127.0.0.1", "127.0.0.1", "127.0.0.1"], connect_options=connect,
                    worker_options={"nthreads": 1}, remote_python=sys.executable,
                    scheduler_options={"port": 0, "dashboard_address": "127.0.0.1:0"}
                    ) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=120)
        yield client


def test_ppo_trains_on_an_ssh_cluster(ssh_client: Client, cluster_tiny_ppo, tmp_path):
    workers = worker_resources(ssh_client)
    assert len(workers) == 2
    summary = train(ssh_client, cluster_tiny_ppo(), get_distribution("actors-learner"),
                    RunSettings(out=tmp_path / "run", steps=512, tensorboard=False,
                                progress=False))
    assert summary["iterations"] == 2 and summary["eval_return_mean"] > 0
    assert {w for ws in summary["placement"].values() for w in ws} <= set(workers)
