"""TLS certificates and SuperNode keys for a loopback deployment, made with ``openssl`` and ``ssh-keygen``.

:func:`make_certificates` makes a CA and a server certificate for
``localhost``/``127.0.0.1`` signed by it (:data:`OPENSSL_COMMANDS`);
:func:`make_node_key` makes one ECDSA P-384 key pair per SuperNode
(:data:`SSH_KEYGEN_COMMAND`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from simulation.deploy.processes import DeployError, run_logged

#: The openssl commands that make the test certificates (``{d}``: the certificate directory).
OPENSSL_COMMANDS: tuple[str, ...] = (
    "openssl genrsa -out {d}/ca.key 4096",
    'openssl req -new -x509 -key {d}/ca.key -sha256 -subj "/CN=sflower-ca" -days 365 -out {d}/ca.crt',
    "openssl genrsa -out {d}/server.key 4096",
    'openssl req -new -key {d}/server.key -subj "/CN=localhost" -out {d}/server.csr',
    "openssl x509 -req -in {d}/server.csr -CA {d}/ca.crt -CAkey {d}/ca.key -CAcreateserial "
    "-out {d}/server.pem -days 365 -sha256 -extfile {d}/server.ext",
)
#: ``{d}/server.ext``: the server certificate's subject alternative names.
SERVER_EXT = "subjectAltName = DNS:localhost, IP:127.0.0.1, IP:::1\n"
#: The command that makes one SuperNode key pair (``{key}``: private key path; ``{key}.pub`` is public).
SSH_KEYGEN_COMMAND = 'ssh-keygen -t ecdsa -b 384 -N "" -C {name} -f {key}'


def make_certificates(cert_dir: Path, log_file: Path) -> dict[str, Path]:
    """Make a CA and a server certificate for localhost/127.0.0.1 with :data:`OPENSSL_COMMANDS`.

    Returns:
        ``{"ca": ca.crt, "cert": server.pem, "key": server.key}``.

    Raises:
        DeployError: openssl is missing or failed (its output is in ``log_file``).
    """
    if shutil.which("openssl") is None:
        raise DeployError("openssl is not installed (needed for the TLS certificates; or pass tls=false auth=false)")
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "server.ext").write_text(SERVER_EXT)
    for command in OPENSSL_COMMANDS:
        run_logged(command.format(d=cert_dir), log_file, "openssl")
    return certificate_paths(cert_dir)


def certificate_paths(cert_dir: Path) -> dict[str, Path]:
    """Where :func:`make_certificates` writes: ``{"ca": ca.crt, "cert": server.pem, "key": server.key}``."""
    return {"ca": cert_dir / "ca.crt", "cert": cert_dir / "server.pem", "key": cert_dir / "server.key"}


def make_node_key(key_dir: Path, name: str, log_file: Path) -> tuple[Path, Path]:
    """Make one SuperNode's ECDSA P-384 key pair with :data:`SSH_KEYGEN_COMMAND`.

    Returns:
        ``(private key path, public key path)``.

    Raises:
        DeployError: ssh-keygen is missing or failed.
    """
    if shutil.which("ssh-keygen") is None:
        raise DeployError("ssh-keygen is not installed (needed for the SuperNode keys; or pass auth=false)")
    key_dir.mkdir(parents=True, exist_ok=True)
    key, pub = key_dir / name, key_dir / f"{name}.pub"
    for path in (key, pub):
        path.unlink(missing_ok=True)
    run_logged(SSH_KEYGEN_COMMAND.format(name=name, key=key), log_file, "ssh-keygen")
    return key, pub

