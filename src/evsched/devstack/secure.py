"""A local broker whose one client listener is SASL_SSL (SCRAM-SHA-512), optionally with ACLs.

For tests of TLS, SASL and the ACLs of docs/security.md: the test makes a CA and a broker
certificate (``devstack.certs``), the SCRAM users are written into the KRaft storage when it is
formatted (``kafka-storage format --add-scram``), and with ``authorizer=True`` the broker runs
StandardAuthorizer with ``allow.everyone.if.no.acl.found=false``. The broker itself is the super
user ``admin`` (and ``ANONYMOUS`` on the loopback-only controller listener, which KRaft's own
broker-to-controller requests use).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from evsched.adapters.kafka.acls import AclRule, create_acls
from evsched.devstack.broker import LocalBroker
from evsched.devstack.certs import CertificateAuthority, make_ca, make_server_cert
from evsched.devstack.config import HOST, new_cluster_id, render_log4j_properties
from evsched.devstack.readiness import run_sync
from evsched.devstack.toolchain import format_storage
from evsched.settings import Settings, kafka_options

MECHANISM = "SCRAM-SHA-512"
ADMIN = "admin"
_AUTHORIZER = """\
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin;User:ANONYMOUS"""


class SecureBroker(LocalBroker):
    """``LocalBroker`` with TLS, a SCRAM user per name in ``users`` and, optionally, ACLs."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        controller_port: int,
        *,
        users: Iterable[str] = (),
        authorizer: bool = False,
        cache_root: Path | None = None,
        ready_timeout_s: float = 180.0,
    ) -> None:
        super().__init__(
            data_dir, port, controller_port, cache_root=cache_root, ready_timeout_s=ready_timeout_s
        )
        self.authorizer = authorizer
        self.tls_dir = self.files.data_dir / "tls"
        self.passwords = self._passwords((ADMIN, *users))
        self.ca = CertificateAuthority(cert=self.tls_dir / "ca.pem", key=self.tls_dir / "ca.key")

    def _passwords(self, users: Iterable[str]) -> dict[str, str]:
        """Random per data dir, kept in it (mode 600) as formatted storage holds them already."""
        path = self.tls_dir / "users.json"
        if path.exists():
            known: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
            return known
        passwords = {name: secrets.token_hex(16) for name in users}
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(json.dumps(passwords), encoding="utf-8")
        return passwords

    def client_env(self, user: str) -> dict[str, str]:
        """The documented ``EVSCHED_KAFKA_*`` variables that connect as ``user``."""
        return {
            "EVSCHED_KAFKA_BOOTSTRAP": self.bootstrap,
            "EVSCHED_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "EVSCHED_KAFKA_SASL_MECHANISM": MECHANISM,
            "EVSCHED_KAFKA_SASL_USERNAME": user,
            "EVSCHED_KAFKA_SASL_PASSWORD": self.passwords[user],
            "EVSCHED_KAFKA_SSL_CAFILE": str(self.ca.cert),
        }

    def client_settings(self, user: str, namespace: str) -> Settings:
        env = {**self.client_env(user), "EVSCHED_NAMESPACE": namespace}
        return Settings.from_env(env)

    def add_acls(self, rules: Iterable[AclRule]) -> int:
        """Create ``rules`` as the super user; how many bindings were created."""
        options = kafka_options(self.client_env(ADMIN))
        return run_sync(create_acls(self.bootstrap, list(rules), **options))

    def _client_options(self) -> dict[str, Any]:
        return kafka_options(self.client_env(ADMIN))

    def _prepare(self, java: str) -> None:
        if not self.ca.cert.exists():
            make_ca(self.tls_dir, name="ca")
        server = make_server_cert(self.ca, self.tls_dir, hosts=(HOST, "localhost"))
        self.files.server_log.parent.mkdir(parents=True, exist_ok=True)
        self.files.server_properties.write_text(
            _render(
                port=self.port,
                controller_port=self.controller_port,
                admin_password=self.passwords[ADMIN],
                keystore=server.keystore,
                truststore=self.ca.cert,
                authorizer=_AUTHORIZER if self.authorizer else "",
                log_dir=self.files.log_dir,
            ),
            encoding="utf-8",
        )
        self.files.log4j_properties.write_text(
            render_log4j_properties(log_file=self.files.server_log, log4j2=self.dist.log4j2),
            encoding="utf-8",
        )
        self._format(java)

    def _format(self, java: str) -> None:
        """Format fresh storage with every SCRAM user in it, so the broker starts with them."""
        if (self.files.log_dir / "meta.properties").exists():
            return
        scram = [
            arg
            for name, password in sorted(self.passwords.items())
            for arg in ("--add-scram", f"{MECHANISM}=[name={name},password={password}]")
        ]
        format_storage(
            self.dist,
            java,
            self.files.server_properties,
            self.files.log4j_properties,
            new_cluster_id(),
            extra_args=scram,
        )


def _render(**values: object) -> str:
    text = resources.files(__package__).joinpath("secure.properties.in").read_text("utf-8")
    return Template(text).substitute(host=HOST, **values)
