"""Process settings read from the environment (``EVSCHED_*``), with defaults for a local stack."""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from evsched.core.bounds import MAX_DURATION_MS, namespace_refusal
from evsched.errors import EvschedError

DEFAULT_BROKER_PORT = 19092
DEFAULT_CONTROLLER_PORT = 19093
DEFAULT_BOOTSTRAP = f"127.0.0.1:{DEFAULT_BROKER_PORT}"
DEFAULT_NAMESPACE = "evsched"
DEFAULT_EVENT_PARTITIONS = 6
REPLICATION_FACTOR_ENV = "EVSCHED_REPLICATION_FACTOR"
DISPATCH_PARTITIONS_ENV = "EVSCHED_DISPATCH_PARTITIONS"

# Client security settings passed through to the Kafka client, for clusters beyond the local one
# (docs/security.md lists them); the password may come from a file instead.
_SECURITY_ENV = {
    "EVSCHED_KAFKA_SASL_USERNAME": "sasl_plain_username",
    "EVSCHED_KAFKA_SASL_PASSWORD": "sasl_plain_password",
}
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# What evsched can pass on from the environment (OAUTHBEARER needs a token provider in code).
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI")
# How a yes/no variable may be spelled (its value stripped and lower-cased).
BOOLEANS = {
    **dict.fromkeys(("1", "true", "yes", "on"), True),
    **dict.fromkeys(("0", "false", "no", "off"), False),
}
# Options whose values never appear in a repr or a log line: the SASL password, a TLS key's
# password, a token provider, anything a library user names like a secret.
_SECRET_OPTION = re.compile(r"password|passwd|secret|token|credential|private", re.IGNORECASE)


_Default = TypeVar("_Default", int, None)


class SettingsError(EvschedError, ValueError):
    """An ``EVSCHED_*`` variable holds what evsched cannot use; the message names it."""


# On/off variables of evsched's own processes (node, worker, API): on when unset.
GC_TUNING_ENV = "EVSCHED_GC_TUNING"
MALLOC_TUNING_ENV = "EVSCHED_MALLOC_TUNING"
PROCESS_SWITCHES = (GC_TUNING_ENV, MALLOC_TUNING_ENV)


def switch_env(env: Mapping[str, str], name: str) -> bool:
    """An on/off variable, on when unset or empty; any other spelling raises SettingsError."""
    value = env.get(name, "").strip().lower()
    if not value:
        return True
    if value not in BOOLEANS:
        raise SettingsError(f"{name}={value[:20]!r}: expected on or off (or true/false, 1/0)")
    return BOOLEANS[value]


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    bootstrap: str = DEFAULT_BOOTSTRAP
    namespace: str = DEFAULT_NAMESPACE
    event_partitions: int = DEFAULT_EVENT_PARTITIONS
    # Of every ``<ns>.dispatch.<queue>`` topic evsched creates; None: as many as the events.
    dispatch_partitions: int | None = None
    # None: min(3, brokers) at provisioning (evsched.adapters.kafka.topics.choose_replication).
    replication_factor: int | None = None
    # Stamped on jobs enqueued without their own (None: the fold's defaults, 7 days and 24 h).
    retention_ms: int | None = None
    key_window_ms: int | None = None
    # The consumer groups' failure detection (nodes, workers); None:
    # adapters.kafka.clients.GROUP_TIMEOUTS.
    # A session below the broker's group.min.session.timeout.ms (6 s by default) is refused by it.
    session_timeout_ms: int | None = None
    heartbeat_interval_ms: int | None = None
    # How often a node writes each changed job's newest record to the state changelog; None:
    # runtime.projection.changelog.FLUSH_INTERVAL_MS (0: every step).
    changelog_interval_ms: int | None = None
    # A KafkaOptions (any mapping given is copied into one): its repr hides the secrets.
    kafka_options: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.kafka_options, KafkaOptions):
            object.__setattr__(self, "kafka_options", KafkaOptions(self.kafka_options))
        # Every topic name starts with the namespace: one too long or odd would fail at the broker,
        # late and for some queues only.
        if (refusal := namespace_refusal(self.namespace)) is not None:
            raise SettingsError(f"EVSCHED_NAMESPACE={self.namespace[:60]!r}: {refusal}")

    def __repr__(self) -> str:
        return (
            f"Settings(bootstrap={self.bootstrap!r}, namespace={self.namespace!r}, "
            f"event_partitions={self.event_partitions!r}, "
            f"dispatch_partitions={self.dispatch_partitions!r}, "
            f"replication_factor={self.replication_factor!r}, "
            f"kafka_options={self.kafka_options!r})"
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        for switch in PROCESS_SWITCHES:  # read at start by the processes: refused here, early
            switch_env(env, switch)
        return cls(
            bootstrap=env.get("EVSCHED_KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP),
            namespace=env.get("EVSCHED_NAMESPACE", DEFAULT_NAMESPACE),
            event_partitions=_int_env(
                env,
                "EVSCHED_EVENT_PARTITIONS",
                low=1,
                default=DEFAULT_EVENT_PARTITIONS,
                empty_ok=False,
            ),
            dispatch_partitions=_int_env(
                env, DISPATCH_PARTITIONS_ENV, low=1, default=None, empty_ok=True
            ),
            replication_factor=_int_env(
                env, REPLICATION_FACTOR_ENV, low=1, default=None, empty_ok=True
            ),
            # Milliseconds; None (unset or empty) leaves the fold's defaults.
            retention_ms=_int_env(
                env,
                "EVSCHED_RETENTION_MS",
                low=0,
                high=MAX_DURATION_MS,
                default=None,
                empty_ok=True,
            ),
            key_window_ms=_int_env(
                env,
                "EVSCHED_KEY_WINDOW_MS",
                low=0,
                high=MAX_DURATION_MS,
                default=None,
                empty_ok=True,
            ),
            session_timeout_ms=_int_env(
                env, "EVSCHED_SESSION_TIMEOUT_MS", low=1, default=None, empty_ok=True
            ),
            heartbeat_interval_ms=_int_env(
                env, "EVSCHED_HEARTBEAT_INTERVAL_MS", low=1, default=None, empty_ok=True
            ),
            changelog_interval_ms=_int_env(
                env,
                "EVSCHED_CHANGELOG_INTERVAL_MS",
                low=0,
                high=60_000,
                default=None,
                empty_ok=True,
            ),
            kafka_options=kafka_options(env),
        )


class KafkaOptions(Mapping[str, Any]):
    """The Kafka client's options, read-only, passed on with ``**``; the repr (and so the str,
    a log line, a traceback's locals) shows ``***`` for every secret's value."""

    __slots__ = ("_options",)

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self._options = dict(options or {})

    def __getitem__(self, name: str) -> Any:
        return self._options[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._options)

    def __len__(self) -> int:
        return len(self._options)

    def __repr__(self) -> str:
        shown = {
            name: "***" if _SECRET_OPTION.search(name) else value
            for name, value in sorted(self._options.items())
        }
        return f"KafkaOptions({shown!r})"


def kafka_options(env: Mapping[str, str]) -> dict[str, Any]:
    """The Kafka client's security options from ``EVSCHED_KAFKA_*``; TLS gets an SSL context.

    Without ``EVSCHED_KAFKA_SSL_CAFILE`` a TLS protocol (SSL, SASL_SSL) verifies the broker
    against the system's trust store, as any TLS client would. A value the client could not
    use raises SettingsError naming the variable.
    """
    options: dict[str, Any] = {
        option: env[name] for name, option in _SECURITY_ENV.items() if env.get(name)
    }
    protocol = _choice(env, "EVSCHED_KAFKA_SECURITY_PROTOCOL", _PROTOCOLS, "PLAINTEXT")
    if env.get("EVSCHED_KAFKA_SECURITY_PROTOCOL"):  # unset: the client's own default
        options["security_protocol"] = protocol
    if protocol.startswith("SASL_"):
        options.update(_sasl_options(env))
    cafile = env.get("EVSCHED_KAFKA_SSL_CAFILE") or None
    if cafile is not None or protocol in {"SSL", "SASL_SSL"}:
        options["ssl_context"] = _ssl_context(env, cafile)
    return options


def _sasl_options(env: Mapping[str, str]) -> dict[str, Any]:
    mechanism = _choice(env, "EVSCHED_KAFKA_SASL_MECHANISM", _MECHANISMS, "PLAIN")
    options: dict[str, Any] = {"sasl_mechanism": mechanism}
    if path := env.get("EVSCHED_KAFKA_SASL_PASSWORD_FILE"):
        if env.get("EVSCHED_KAFKA_SASL_PASSWORD"):
            raise SettingsError(
                "EVSCHED_KAFKA_SASL_PASSWORD and EVSCHED_KAFKA_SASL_PASSWORD_FILE are both set: "
                "use one"
            )
        try:
            options["sasl_plain_password"] = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SettingsError(f"EVSCHED_KAFKA_SASL_PASSWORD_FILE={path!r}: {exc}") from None
    password = options.get("sasl_plain_password") or env.get("EVSCHED_KAFKA_SASL_PASSWORD")
    if mechanism != "GSSAPI" and not (env.get("EVSCHED_KAFKA_SASL_USERNAME") and password):
        raise SettingsError(
            f"EVSCHED_KAFKA_SASL_MECHANISM={mechanism} needs EVSCHED_KAFKA_SASL_USERNAME and "
            "EVSCHED_KAFKA_SASL_PASSWORD (or EVSCHED_KAFKA_SASL_PASSWORD_FILE)"
        )
    return options


def _ssl_context(env: Mapping[str, str], cafile: str | None) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(f"EVSCHED_KAFKA_SSL_CAFILE={cafile!r}: {exc}") from None
    check = env.get("EVSCHED_KAFKA_SSL_CHECK_HOSTNAME", "true").strip().lower()
    if check not in BOOLEANS:
        raise SettingsError(
            f"EVSCHED_KAFKA_SSL_CHECK_HOSTNAME={check[:20]!r}: expected true or false"
        )
    # The certificate is still verified against the CA without it; only the name is not.
    context.check_hostname = BOOLEANS[check]
    return context


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = (env.get(name) or default).strip().upper()
    if value not in choices:
        raise SettingsError(f"{name}={env[name][:40]!r}: expected one of {', '.join(choices)}")
    return value


def _int_env(
    env: Mapping[str, str],
    name: str,
    *,
    low: int,
    high: int | None = None,
    default: _Default,
    empty_ok: bool,
) -> int | _Default:
    """``name`` as an integer in [low, high]; unset (or blank, when ``empty_ok``) is ``default``."""
    text = env.get(name)
    if text is None or (empty_ok and not text.strip()):
        return default
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        bounds = f"of at least {low}" if high is None else f"in [{low}, {high}]"
        raise SettingsError(f"{name}={text[:40]!r}: expected an integer {bounds}")
    return value
