"""TLS end to end: the embedded cluster with temporary credentials, and an external
scheduler and worker that require certificates; everything bound to 127.0.0.1."""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REPO = Path(__file__).resolve().parent.parent
TINY = ["--steps", "1024", "--num-actors", "2", "--num-envs", "4", "--num-steps", "32",
        "--no-progress", "--no-eval"]

pytestmark = pytest.mark.timeout(300)


def _daskrl(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daskrl.cli", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=240)


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _certificates(folder: Path) -> dict[str, Path]:
    """A CA and one certificate it signed for 127.0.0.1 (scheduler, worker and client)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "daskrl test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": folder / "ca.pem", "cert": folder / "cert.pem", "key": folder / "key.pem"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, paths["key"])
    return paths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_embedded_cluster_with_tls_trains_on_127_0_0_1(tmp_path):
    run = _daskrl(["train", str(REPO / "graphs" / "ppo.py"), "--tls", "--out", "run", *TINY],
                  tmp_path)
    assert run.returncode == 0, run.stderr
    assert "scheduler: tls://127.0.0.1:" in run.stderr
    assert "dashboard: http://127.0.0.1:" in run.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["env_steps"] >= 1024


def test_external_tls_scheduler_needs_the_certificates(tmp_path):
    pem = _certificates(tmp_path)
    tls = ["--tls-ca-file", str(pem["ca"]), "--tls-cert", str(pem["cert"]), "--tls-key",
           str(pem["key"])]
    port = _free_port()
    address = f"tls://127.0.0.1:{port}"
    logs = [(tmp_path / n).open("w") for n in ("scheduler.log", "worker.log")]
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler",
                               "--host", "127.0.0.1", "--port", str(port), "--protocol", "tls",
                               "--dashboard-address", "127.0.0.1:0", *tls],
                              stdout=logs[0], stderr=subprocess.STDOUT)]
    try:
        time.sleep(2)
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker",
                                       address, "--host", "127.0.0.1", "--nthreads", "1",
                                       "--resources", "CPU=1", "--name", "a", *tls],
                                      stdout=logs[1], stderr=subprocess.STDOUT))
        graph = str(REPO / "graphs" / "ppo.py")
        ok = _daskrl(["train", graph, "--scheduler", address, "--tls", *tls, "--out", "run",
                      *TINY], tmp_path)
        assert ok.returncode == 0, ok.stderr + (tmp_path / "worker.log").read_text()
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert set(sum(summary["placement"].values(), [])) == {"a"}

        missing = _daskrl(["train", graph, "--scheduler", address, "--tls", "--out", "x",
                           *TINY], tmp_path)
        assert missing.returncode == 2
        assert "--tls-ca-file" in missing.stderr.splitlines()[-1]
        plain = _daskrl(["train", graph, "--scheduler", address, "--out", "y", *TINY],
                        tmp_path)
        assert plain.returncode == 2
        errors = [ln for ln in plain.stderr.splitlines() if ln.startswith("daskrl: error:")]
        assert len(errors) == 1, plain.stderr
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        for log in logs:
            log.close()
