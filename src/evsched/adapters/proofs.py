"""Proofs of role on the events log: HMACs by the node keys, checked by every process that folds.

A node's fact (core.roles) carries in its ``evsched-proof`` header the id of the node key that
proves it and ``HMAC(node key, value)``. A worker's fact carries ``HMAC(lease key, value)``, where
the lease key is ``HMAC(node key, job id and token)``: the node that leased the job derived it and
sent it in the dispatch record, which only workers read. So a worker proves only the attempts it
was leased, a producer (which reads the events log but no dispatch topic) proves nothing, and a
verifier needs the node keys alone. The key ring's first key proves; all of them verify, so a
retired key still proves the history it signed (key rotation: add the new key first, keep the
old ones as long as the log, its archives or exports hold records they proved).

HMAC and not a signature: a proof costs about 2 µs to make or check, where an Ed25519 check cost
125 µs on the reference machine, at least three times per job on every node and replica. What
that costs is that a process that can check proofs can make them: nodes, and the API and the
command line when given the keys to fold exactly as the nodes do (docs/security.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from evsched.core.events import (
    AttemptCheckpointed,
    AttemptFailed,
    AttemptSnoozed,
    AttemptStarted,
    AttemptSucceeded,
    Event,
    LeaseRenewed,
    Position,
    Role,
)
from evsched.core.roles import proof_role
from evsched.errors import EvschedError

PROOF_HEADER = "evsched-proof"
KEY_ENV = "EVSCHED_NODE_KEY"
KEY_FILE_ENV = "EVSCHED_NODE_KEY_FILE"
RETIRED_ENV = "EVSCHED_NODE_KEYS_RETIRED"
MIN_KEY_CHARS = 32
KEY_ID_BYTES = 8
MAC_BYTES = 32
PROOF_BYTES = KEY_ID_BYTES + MAC_BYTES
# Bumped if what is proven ever changes, so an old proof can never verify a new layout.
_NODE = b"evsched-node-proof-v1\x00"
_LEASE = b"evsched-lease-key-v1\x00"
_WORKER = b"evsched-worker-proof-v1\x00"
_KEY_ID = b"evsched-node-key-id-v1\x00"
_ATTEMPTS = (
    AttemptStarted,
    LeaseRenewed,
    AttemptCheckpointed,
    AttemptSucceeded,
    AttemptFailed,
    AttemptSnoozed,
)


class MissingNodeKey(EvschedError):
    """A node was started without a node key and without the explicit opt-out."""


def _mac(key: bytes, message: bytes) -> bytes:
    return hmac.digest(key, message, "sha256")


def key_id(secret: bytes) -> bytes:
    """The id a proof names its key by: a one-way digest of the key, so it needs no naming."""
    return hashlib.sha256(_KEY_ID + secret).digest()[:KEY_ID_BYTES]


class NodeKeyring:
    """The node keys: the first proves, every one verifies; repr and str never show them."""

    __slots__ = ("_current", "_current_id", "_keys")

    def __init__(self, current: str, retired: Iterable[str] = ()) -> None:
        secrets = [current, *retired]
        for secret in secrets:
            if len(secret) < MIN_KEY_CHARS:
                raise EvschedError(f"a node key needs at least {MIN_KEY_CHARS} characters")
        self._keys: dict[bytes, bytes] = {}
        for secret in secrets:
            raw = secret.encode()
            self._keys.setdefault(key_id(raw), raw)
        self._current = current.encode()
        self._current_id = key_id(self._current)

    def __repr__(self) -> str:
        return f"NodeKeyring(<{len(self._keys)} keys redacted>)"

    __str__ = __repr__

    def prove(self, value: bytes) -> bytes:
        """The proof of a node's record ``value``: the current key's id and its HMAC."""
        return self._current_id + _mac(self._current, _NODE + value)

    def header(self, value: bytes) -> tuple[str, bytes]:
        return (PROOF_HEADER, self.prove(value))

    def lease_key(self, job_id: str, token: int) -> bytes:
        """The key of lease ``token`` of ``job_id``, for its dispatch record: id and secret."""
        return self._current_id + self._lease_secret(self._current, job_id, token)

    @staticmethod
    def _lease_secret(key: bytes, job_id: str, token: int) -> bytes:
        return _mac(key, _LEASE + job_id.encode() + b"\x00" + str(token).encode())

    def proven(self, event: Event, value: bytes, proof: bytes | None) -> Role | None:
        """The role ``proof`` proves for ``event`` (written as ``value``), or None."""
        role = proof_role(event)
        if role is None or proof is None or len(proof) != PROOF_BYTES:
            return None
        key = self._keys.get(proof[:KEY_ID_BYTES])
        if key is None:
            return None
        if role is Role.WORKER and isinstance(event, _ATTEMPTS):
            lease = self._lease_secret(key, event.job_id, event.token)
            expected = _mac(lease, _WORKER + value)
        elif role is Role.NODE:
            expected = _mac(key, _NODE + value)
        else:
            return None
        return role if hmac.compare_digest(proof[KEY_ID_BYTES:], expected) else None


def worker_proof(lease_key: bytes, value: bytes) -> bytes:
    """The proof of a worker's record ``value`` under the ``lease_key`` its dispatch carried."""
    if len(lease_key) != PROOF_BYTES:
        raise EvschedError("a lease key is a key id and a 32-byte secret")
    return lease_key[:KEY_ID_BYTES] + _mac(lease_key[KEY_ID_BYTES:], _WORKER + value)


def proof_of(headers: Sequence[tuple[str, bytes]]) -> bytes | None:
    """The record's one proof header, or None (none, or more than one: nothing is proven)."""
    found = [v for k, v in headers if k == PROOF_HEADER]
    return found[0] if len(found) == 1 else None


class PartitionProofs:
    """What one partition's records prove, as the fold reads it from their positions.

    ``required`` turns on at the first record whose proof verifies and stays on (core.roles).
    Without a key ring nothing can be checked: nothing is proven and nothing required, so such a
    process folds as an older version did (and may disagree with the nodes about a forgery).
    """

    __slots__ = ("_keyring", "required")

    def __init__(self, keyring: NodeKeyring | None, *, required: bool = False) -> None:
        self._keyring = keyring
        # Without keys nothing can be checked, so nothing is required, whatever the index says.
        self.required = required and keyring is not None

    def position(
        self,
        *,
        partition: int,
        offset: int,
        log_at: int,
        event: Event,
        value: bytes,
        proof: bytes | None,
    ) -> Position:
        proven = None
        if self._keyring is not None and proof is not None:
            proven = self._keyring.proven(event, value, proof)
            if proven is not None:
                self.required = True
        return Position(
            partition=partition,
            offset=offset,
            log_at=log_at,
            proven=proven,
            proofs_required=self.required,
        )


def node_keyring_from_env(environ: Mapping[str, str] | None = None) -> NodeKeyring | None:
    """The keys from ``EVSCHED_NODE_KEY_FILE`` (one per line, the current one first) or
    ``EVSCHED_NODE_KEY`` with ``EVSCHED_NODE_KEYS_RETIRED`` (comma-separated); None without."""
    env = os.environ if environ is None else environ
    if path := env.get(KEY_FILE_ENV, "").strip():
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise MissingNodeKey(f"{KEY_FILE_ENV}: cannot read {path}: {exc.strerror}") from exc
        keys = [line.strip() for line in lines if line.strip()]
        if not keys:
            raise MissingNodeKey(f"{KEY_FILE_ENV}: {path} holds no key")
        return NodeKeyring(keys[0], keys[1:])
    if current := env.get(KEY_ENV, "").strip():
        retired = [k.strip() for k in env.get(RETIRED_ENV, "").split(",") if k.strip()]
        return NodeKeyring(current, retired)
    return None


class LogProofs:
    """``PartitionProofs`` for every partition of a history folded from its start (a replay)."""

    __slots__ = ("_keyring", "_partitions")

    def __init__(self, keyring: NodeKeyring | None) -> None:
        self._keyring = keyring
        self._partitions: dict[int, PartitionProofs] = {}

    def required(self, partition: int) -> bool:
        found = self._partitions.get(partition)
        return found is not None and found.required

    def partition(self, partition: int) -> PartitionProofs:
        """The partition's ``PartitionProofs``, made on the partition's first record."""
        proofs = self._partitions.get(partition)
        if proofs is None:
            proofs = self._partitions[partition] = PartitionProofs(self._keyring)
        return proofs


def generate_key() -> str:
    """A fresh random node key, as text for ``EVSCHED_NODE_KEY`` (the dev stack uses this)."""
    return secrets.token_hex(32)
