"""A throwaway CA and a broker certificate signed by it, made with the ``openssl`` command line."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evsched.devstack.errors import DevstackError
from evsched.devstack.toolchain import require_tool

OPENSSL_HINT = "openssl is required to make test certificates: apt-get install openssl"
# Short-lived on purpose: these files live in a test's temp dir and guard loopback only.
_DAYS = "2"
_CURVE = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificateAuthority:
    """A CA's certificate (what clients trust) and its key (what signs broker certificates)."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerCertificate:
    """A certificate chain and its private key in one PEM file, as Kafka's PEM keystore reads."""

    keystore: Path
    cert: Path


def _openssl(*args: str) -> None:
    openssl = require_tool("openssl", OPENSSL_HINT)
    done = subprocess.run([openssl, *args], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise DevstackError(f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}")


def make_ca(directory: Path, name: str = "evsched test CA") -> CertificateAuthority:
    """A self-signed CA in ``directory`` (``<stem>.pem`` and ``<stem>.key``)."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = name.lower().replace(" ", "-")
    ca = CertificateAuthority(cert=directory / f"{stem}.pem", key=directory / f"{stem}.key")
    _openssl(
        "req", "-x509", *_CURVE, "-keyout", str(ca.key), "-out", str(ca.cert), "-days", _DAYS,
        "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-addext", "subjectKeyIdentifier=hash",
    )  # fmt: skip
    return ca


def make_server_cert(
    ca: CertificateAuthority,
    directory: Path,
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    name: str = "broker",
) -> ServerCertificate:
    """A certificate for ``hosts`` (IP addresses or DNS names) signed by ``ca``."""
    directory.mkdir(parents=True, exist_ok=True)
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    names = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() else f"DNS:{h}" for h in hosts)
    extensions = directory / f"{name}.ext"
    extensions.write_text(
        "\n".join(
            [
                "basicConstraints=critical,CA:FALSE",
                "keyUsage=critical,digitalSignature,keyEncipherment",
                # The broker also connects to itself (inter-broker listener) with this certificate.
                "extendedKeyUsage=serverAuth,clientAuth",
                f"subjectAltName={names}",
                "subjectKeyIdentifier=hash",
                "authorityKeyIdentifier=keyid,issuer",
                "",
            ]
        ),
        encoding="utf-8",
    )
    _openssl("req", *_CURVE, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={hosts[0]}")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-out", str(cert), "-days", _DAYS, "-extfile", str(extensions),
    )  # fmt: skip
    keystore = directory / f"{name}-keystore.pem"
    # Kafka's PEM keystore: an unencrypted PKCS#8 key followed by the certificate chain.
    keystore.write_text(
        key.read_text(encoding="utf-8") + cert.read_text(encoding="utf-8"), encoding="utf-8"
    )
    keystore.chmod(0o600)
    return ServerCertificate(keystore=keystore, cert=cert)
