"""``awp serve --tls-cert/--tls-key`` serves HTTPS; a real ``awp worker`` and the CLI reach it with ``https://``
and ``--ca-file``, and a client that does not trust the certificate is refused.

The certificates are made here with the ``openssl`` command (a CA, and a server certificate for 127.0.0.1
signed by it); the ``cryptography`` package is not a dependency of the project.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from worker_support import REPO, Workers, mock_task

from awp_testing.gateway import ServeProcess, serve

AWP = [sys.executable, "-c", "import sys; from awp.cli.main import main; sys.exit(main())"]
EXIT_CONFIG = 2  # awp worker: a configuration error (python/awp/worker/config.py)

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(directory: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA certificate and a server certificate (and key) for 127.0.0.1 / localhost signed by it."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.pem", "-days", "2",
            "-subj", f"/CN=AWP test CA {name}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)  # fmt: skip
    (directory / f"{name}.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", "/CN=127.0.0.1", cwd=directory)
    ca = ["-CA", f"{name}-ca.pem", "-CAkey", f"{name}-ca.key", "-CAcreateserial"]
    openssl("x509", "-req", "-in", f"{name}.csr", *ca, "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
            cwd=directory)  # fmt: skip
    return directory / f"{name}-ca.pem", directory / f"{name}.pem", directory / f"{name}.key"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("tls")
    ca, cert, key = make_certificates(directory, "gateway")
    other_ca, _, _ = make_certificates(directory, "other")
    return {"ca": ca, "cert": cert, "key": key, "other_ca": other_ca}


@pytest.fixture(scope="module")
def gw(db_dsn: str, certs: dict[str, Path]) -> Iterator[ServeProcess]:
    args = ["--tls-cert", str(certs["cert"]), "--tls-key", str(certs["key"])]
    with serve(db_dsn, args=args, ca_file=str(certs["ca"])) as gateway:
        yield gateway


def awp(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWP_")}
    return subprocess.run(
        [*AWP, *args], env={**clean, **(env or {})}, cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_a_worker_and_the_cli_run_a_workflow_over_https(
    gw: ServeProcess, certs: dict[str, Path], tmp_path: Path
) -> None:
    assert gw.base_url.startswith("https://")
    assert "awp serve listening on https://127.0.0.1:" in gw.log_tail()
    env = {"AWP_GATEWAY_URL": gw.base_url, "AWP_OPERATOR_TOKEN": gw.tokens.operator}
    definition = tmp_path / "tls.yaml"
    definition.write_text(yaml.safe_dump({"id": "tls", "tasks": [mock_task("a"), mock_task("b", ["a"])]}))
    with Workers(gw) as workers:
        w = workers.start("tls-worker", extra=["--ca-file", str(certs["ca"])])
        applied = awp("workflow", "apply", str(definition), "--ca-file", str(certs["ca"]), env=env)
        assert applied.returncode == 0, applied.stderr
        started = awp("run", "start", "tls", "--wait", "--json", env={**env, "AWP_CA_FILE": str(certs["ca"])})
        assert started.returncode == 0, started.stdout + started.stderr + w.log()[-2000:]
        assert json.loads(started.stdout)["final_status"] == "succeeded"
        listed = awp("workers", "--json", "--ca-file", str(certs["ca"]), env=env)
        assert listed.returncode == 0, listed.stderr
        assert any(x["display_name"] == "tls-worker" for x in json.loads(listed.stdout))


def test_a_client_without_the_ca_is_refused(gw: ServeProcess, certs: dict[str, Path]) -> None:
    env = {"AWP_GATEWAY_URL": gw.base_url, "AWP_OPERATOR_TOKEN": gw.tokens.operator}
    for extra in ([], ["--ca-file", str(certs["other_ca"])]):  # the system's trust store; another CA
        refused = awp("workers", *extra, env=env)
        assert refused.returncode == 1
        assert "TLS certificate does not verify" in refused.stderr and "--ca-file" in refused.stderr, refused.stderr
    with Workers(gw) as workers:  # a worker gives up at once: waiting would not make the certificate valid
        w = workers.start("untrusting-worker")
        assert w.wait_exit(30) == EXIT_CONFIG, w.log()
        assert "TLS certificate does not verify" in w.log()
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(gw.url("/health/live"), timeout=5)
    with pytest.raises(httpx.HTTPError):  # no plain HTTP on the TLS port
        httpx.get(f"http://127.0.0.1:{gw.port}/health/live", timeout=5)
    trusting = ssl.create_default_context(cafile=str(certs["ca"]))
    assert httpx.get(gw.url("/health/live"), verify=trusting, timeout=5).status_code == 200


def test_tls_options_are_checked_at_start(db_dsn: str, certs: dict[str, Path]) -> None:
    tokens = {r: f"{r}-{'x' * 40}" for r in ("AWP_VIEWER_TOKEN", "AWP_OPERATOR_TOKEN", "AWP_WORKER_BOOTSTRAP_TOKEN")}
    env = {"AWP_DATABASE_URL": db_dsn, **tokens}
    alone = awp("serve", "--port", "1", "--tls-cert", str(certs["cert"]), env=env)
    assert alone.returncode == 2 and "--tls-cert and --tls-key go together" in alone.stderr, alone.stderr
    wrong_key = awp("serve", "--port", "1", "--tls-cert", str(certs["cert"]), "--tls-key", str(certs["ca"]), env=env)
    assert wrong_key.returncode == 2 and "cannot use --tls-cert" in wrong_key.stderr, wrong_key.stderr
