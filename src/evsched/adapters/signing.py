"""HMAC authentication of dispatch records with a namespace key held by nodes and workers only."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from evsched.errors import EvschedError

SIGNATURE_HEADER = "evsched-signature"
KEY_ENV = "EVSCHED_DISPATCH_KEY"
KEY_FILE_ENV = "EVSCHED_DISPATCH_KEY_FILE"
UNSIGNED_ENV = "EVSCHED_INSECURE_UNSIGNED_DISPATCH"
MIN_KEY_CHARS = 32
# Bumped if what is signed ever changes, so an old signature can never verify a new layout.
_DOMAIN = b"evsched-dispatch-v1\x00"
TRUE_VALUES = frozenset({"1", "true", "yes", "on"})


class MissingDispatchKey(EvschedError):
    """A node or worker was started without a dispatch key and without the explicit opt-out."""


class DispatchKey:
    """The shared secret; its repr and str never show it (it ends up in logs and tracebacks)."""

    __slots__ = ("_secret",)

    def __init__(self, secret: str) -> None:
        if len(secret) < MIN_KEY_CHARS:
            raise EvschedError(f"a dispatch key needs at least {MIN_KEY_CHARS} characters")
        self._secret = secret.encode()

    @staticmethod
    def generate() -> str:
        """A fresh random key, as text for ``EVSCHED_DISPATCH_KEY`` (the dev stack uses this)."""
        return secrets.token_hex(32)

    def __repr__(self) -> str:
        return "DispatchKey(<redacted>)"

    __str__ = __repr__

    def sign(self, topic: str, value: bytes) -> bytes:
        """The signature of ``value`` on ``topic``: a record moved to another topic fails."""
        message = _DOMAIN + topic.encode() + b"\x00" + value
        return hmac.new(self._secret, message, hashlib.sha256).digest()

    def header(self, topic: str, value: bytes) -> tuple[str, bytes]:
        return (SIGNATURE_HEADER, self.sign(topic, value))

    def check(self, topic: str, value: bytes, headers: Sequence[tuple[str, bytes]]) -> str | None:
        """Why the record is not authentic ("unsigned" or "forged"), or None when it is."""
        signatures = [v for k, v in headers if k == SIGNATURE_HEADER]
        if not signatures:
            return "unsigned"
        if len(signatures) > 1 or not hmac.compare_digest(signatures[0], self.sign(topic, value)):
            return "forged"
        return None


def dispatch_key_from_env(environ: Mapping[str, str] | None = None) -> DispatchKey | None:
    """The key from ``EVSCHED_DISPATCH_KEY_FILE`` or ``EVSCHED_DISPATCH_KEY``.

    None only with ``EVSCHED_INSECURE_UNSIGNED_DISPATCH=1`` (then records go unsigned and are
    accepted unsigned); without any of them, MissingDispatchKey: a node or worker does not start.
    """
    env = os.environ if environ is None else environ
    if path := env.get(KEY_FILE_ENV, "").strip():
        try:
            secret = Path(path).read_text().strip()
        except OSError as exc:
            raise MissingDispatchKey(f"{KEY_FILE_ENV}: cannot read {path}: {exc.strerror}") from exc
        return DispatchKey(secret)
    if secret := env.get(KEY_ENV, "").strip():
        return DispatchKey(secret)
    if env.get(UNSIGNED_ENV, "").strip().lower() in TRUE_VALUES:
        return None
    raise MissingDispatchKey(
        f"no dispatch key: set {KEY_FILE_ENV} (a file holding the key) or {KEY_ENV}, the same "
        f"on every node and worker of the namespace, or {UNSIGNED_ENV}=1 to run without "
        "authenticating dispatch records (see docs/security.md)"
    )
