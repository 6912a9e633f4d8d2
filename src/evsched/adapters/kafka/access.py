"""Why a broker refuses this client: TLS and SASL failures named in one line, not retried.

aiokafka reports every failed bootstrap as "Unable to bootstrap" and logs the cause; when that
happens, one direct connection per bootstrap address tells a refusal (an untrusted certificate,
a wrong password or mechanism) from an outage, so a process can stop with the cause instead of
retrying for ever.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from aiokafka.conn import collect_hosts, create_conn
from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from evsched.errors import BrokerAccessRefused

# The options of a connection; the rest of a client's options do not matter for a handshake.
_CONNECTION_OPTIONS = (
    "security_protocol",
    "ssl_context",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
)
_HOSTNAME_MISMATCH = 62  # X509_V_ERR_HOSTNAME_MISMATCH
_EXPIRED = 10  # X509_V_ERR_CERT_HAS_EXPIRED


async def access_refusal(
    bootstrap: str, *, timeout_s: float = 10.0, **client_options: Any
) -> BrokerAccessRefused | None:
    """The first bootstrap address's refusal of this client, or None: accepted, or unreachable."""
    options = {k: v for k, v in client_options.items() if k in _CONNECTION_OPTIONS}
    for host, port, _ in collect_hosts(bootstrap, randomize=False):
        try:
            conn = await create_conn(
                host, port, request_timeout_ms=int(timeout_s * 1000), **options
            )
        except (OSError, TimeoutError, KafkaConnectionError, IllegalSaslStateError) as exc:
            reason = _reason(exc, host, options)
        except (SaslAuthenticationFailed, UnsupportedSaslMechanismError) as exc:
            reason = _sasl_reason(exc, options)
        else:
            conn.close()
            return None
        if reason is not None:
            return BrokerAccessRefused(f"Kafka at {host}:{port} refused the connection: {reason}")
    return None


async def check_access(bootstrap: str, **client_options: Any) -> None:
    """Raise BrokerAccessRefused when the broker refuses this client; an outage passes."""
    refusal = await access_refusal(bootstrap, **client_options)
    if refusal is not None:
        raise refusal


async def raise_if_refused(bootstrap: str, exc: BaseException, **client_options: Any) -> None:
    """Raise BrokerAccessRefused (from ``exc``) when a failed bootstrap was a TLS/SASL refusal."""
    if isinstance(exc, KafkaConnectionError):
        refusal = await access_refusal(bootstrap, **client_options)
        if refusal is not None:
            raise refusal from exc


async def failure_text(bootstrap: str, exc: BaseException, **client_options: Any) -> str:
    """``exc`` in one line, or the broker's refusal of this client when that is what it was."""
    if isinstance(exc, KafkaConnectionError):
        refusal = await access_refusal(bootstrap, **client_options)
        if refusal is not None:
            return str(refusal)
    return repr(exc)


def _sasl_reason(exc: BaseException, options: Mapping[str, Any]) -> str:
    mechanism = options.get("sasl_mechanism", "PLAIN")
    if isinstance(exc, UnsupportedSaslMechanismError):
        return (
            f"the SASL mechanism {mechanism} is not enabled on the broker "
            "(EVSCHED_KAFKA_SASL_MECHANISM)"
        )
    user = options.get("sasl_plain_username")
    # The broker's own words ("... due to invalid credentials ..."), without aiokafka's prefix.
    detail = " ".join(str(exc.args[0] if exc.args else exc).split()) or type(exc).__name__
    return (
        f"SASL authentication as {user!r} with {mechanism} failed: {detail} "
        "(EVSCHED_KAFKA_SASL_USERNAME, EVSCHED_KAFKA_SASL_PASSWORD)"
    )


def _reason(exc: BaseException, host: str, options: Mapping[str, Any]) -> str | None:
    protocol = options.get("security_protocol", "PLAINTEXT")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return _certificate_reason(exc, host)
    if isinstance(exc, ssl.SSLError):
        why = getattr(exc, "reason", None) or exc
        return (
            f"the TLS handshake failed ({why}): is this a TLS listener? "
            f"(EVSCHED_KAFKA_SECURITY_PROTOCOL={protocol})"
        )
    if isinstance(exc, IllegalSaslStateError):
        return f"the SASL handshake failed: {exc} (EVSCHED_KAFKA_SASL_MECHANISM)"
    return None


def _certificate_reason(exc: ssl.SSLCertVerificationError, host: str) -> str:
    message = exc.verify_message or str(exc)
    if exc.verify_code == _HOSTNAME_MISMATCH:
        return (
            f"the broker's TLS certificate does not name {host!r} ({message}); connect by a name "
            "it holds, or set EVSCHED_KAFKA_SSL_CHECK_HOSTNAME=false"
        )
    if exc.verify_code == _EXPIRED:
        return f"the broker's TLS certificate has expired ({message})"
    return (
        f"the broker's TLS certificate is not trusted ({message}); EVSCHED_KAFKA_SSL_CAFILE must "
        "name the CA that signed it"
    )
