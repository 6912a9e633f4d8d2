"""Proofs of role (adapters.proofs): node proofs, lease keys and worker proofs, key rotation."""

from __future__ import annotations

from pathlib import Path

import pytest

from evsched.adapters import avro
from evsched.adapters.proofs import (
    KEY_ENV,
    KEY_FILE_ENV,
    PROOF_HEADER,
    RETIRED_ENV,
    LogProofs,
    MissingNodeKey,
    NodeKeyring,
    PartitionProofs,
    generate_key,
    node_keyring_from_env,
    proof_of,
    worker_proof,
)
from evsched.core.events import AttemptSucceeded, JobCancelled, JobLeased, Role
from evsched.errors import EvschedError

OLD, NEW = generate_key(), generate_key()


def _leased(token: int = 1) -> JobLeased:
    return JobLeased(
        event_id=f"l{token}", job_id="j", emitted_at=0, source="node-x", token=token, attempt=1,
        lease_ms=30_000,
    )  # fmt: skip


def _succeeded(token: int = 1, job_id: str = "j") -> AttemptSucceeded:
    return AttemptSucceeded(
        event_id="s", job_id=job_id, emitted_at=0, source="w", token=token, result=b"1"
    )


def test_a_node_proof_verifies_and_a_changed_record_does_not() -> None:
    ring = NodeKeyring(NEW)
    event = _leased()
    value = avro.encode_event(event)
    proof = ring.prove(value)
    assert ring.proven(event, value, proof) is Role.NODE
    other = avro.encode_event(_leased(2))
    assert ring.proven(_leased(2), other, proof) is None  # a proof of another record
    assert ring.proven(event, value, proof[:-1] + bytes([proof[-1] ^ 1])) is None
    assert NodeKeyring(generate_key()).proven(event, value, proof) is None  # another key


def test_a_retired_key_still_verifies_the_history_it_proved_but_proves_nothing_new() -> None:
    event = _leased()
    value = avro.encode_event(event)
    old_proof = NodeKeyring(OLD).prove(value)
    rotated = NodeKeyring(NEW, [OLD])
    assert rotated.proven(event, value, old_proof) is Role.NODE
    assert rotated.prove(value) == NodeKeyring(NEW).prove(value)
    assert NodeKeyring(NEW).proven(event, value, old_proof) is None  # dropped: proves nothing


def test_a_worker_proves_with_its_lease_key_only_the_attempt_it_was_leased() -> None:
    ring = NodeKeyring(NEW)
    lease_key = ring.lease_key("j", 1)
    event = _succeeded()
    value = avro.encode_event(event)
    proof = worker_proof(lease_key, value)
    assert ring.proven(event, value, proof) is Role.WORKER
    # The same bytes claimed for another token or job: the lease key does not match.
    other_token = _succeeded(token=2)
    assert ring.proven(other_token, avro.encode_event(other_token), proof) is None
    two = avro.encode_event(other_token)
    assert ring.proven(other_token, two, worker_proof(lease_key, two)) is None
    other_job = _succeeded(job_id="k")
    k = avro.encode_event(other_job)
    assert ring.proven(other_job, k, worker_proof(lease_key, k)) is None
    # A node proof of a worker's kind is no worker proof, and the other way round.
    assert ring.proven(event, value, ring.prove(value)) is None
    leased = _leased()
    lv = avro.encode_event(leased)
    assert ring.proven(leased, lv, worker_proof(ring.lease_key("j", 1), lv)) is None


def test_a_producer_kind_is_never_proven_and_a_malformed_proof_proves_nothing() -> None:
    ring = NodeKeyring(NEW)
    cancel = JobCancelled(event_id="c", job_id="j", emitted_at=0, source="cli")
    value = avro.encode_event(cancel)
    assert ring.proven(cancel, value, ring.prove(value)) is None
    event = _leased()
    value = avro.encode_event(event)
    assert ring.proven(event, value, None) is None
    assert ring.proven(event, value, b"short") is None
    with pytest.raises(EvschedError):
        worker_proof(b"short", value)


def test_the_proof_header_is_read_only_when_there_is_exactly_one() -> None:
    assert proof_of([(PROOF_HEADER, b"p")]) == b"p"
    assert proof_of([]) is None
    assert proof_of([(PROOF_HEADER, b"p"), (PROOF_HEADER, b"q")]) is None


def test_a_partition_requires_proofs_from_its_first_proven_record_on() -> None:
    ring = NodeKeyring(NEW)
    proofs = PartitionProofs(ring)
    event = _leased()
    value = avro.encode_event(event)
    before = proofs.position(partition=0, offset=1, log_at=1, event=event, value=value, proof=None)
    assert (before.proven, before.proofs_required) == (None, False)
    proven = proofs.position(
        partition=0, offset=2, log_at=1, event=event, value=value, proof=ring.prove(value)
    )
    assert (proven.proven, proven.proofs_required) == (Role.NODE, True)
    after = proofs.position(partition=0, offset=3, log_at=1, event=event, value=value, proof=None)
    assert (after.proven, after.proofs_required) == (None, True)


def test_without_keys_nothing_is_proven_or_required() -> None:
    ring = NodeKeyring(NEW)
    event = _leased()
    value = avro.encode_event(event)
    at = PartitionProofs(None).position(
        partition=0, offset=1, log_at=1, event=event, value=value, proof=ring.prove(value)
    )
    assert (at.proven, at.proofs_required) == (None, False)


def test_a_replay_keeps_each_partitions_requirement_apart() -> None:
    ring = NodeKeyring(NEW)
    proofs = LogProofs(ring)
    event = _leased()
    value = avro.encode_event(event)
    proofs.partition(0).position(
        partition=0, offset=0, log_at=1, event=event, value=value, proof=ring.prove(value)
    )
    assert proofs.required(0) and not proofs.required(1)
    at = proofs.partition(1).position(
        partition=1, offset=0, log_at=1, event=event, value=value, proof=None
    )
    assert not at.proofs_required


def test_keys_from_the_environment(tmp_path: Path) -> None:
    assert node_keyring_from_env({}) is None
    ring = node_keyring_from_env({KEY_ENV: NEW, RETIRED_ENV: f" {OLD} ,"})
    assert ring is not None
    value = avro.encode_event(_leased())
    assert ring.proven(_leased(), value, NodeKeyring(OLD).prove(value)) is Role.NODE
    file = tmp_path / "keys"
    file.write_text(f"{NEW}\n\n{OLD}\n")
    from_file = node_keyring_from_env({KEY_FILE_ENV: str(file), KEY_ENV: "ignored"})
    assert from_file is not None and from_file.prove(value) == NodeKeyring(NEW).prove(value)
    assert from_file.proven(_leased(), value, NodeKeyring(OLD).prove(value)) is Role.NODE
    file.write_text("\n")
    with pytest.raises(MissingNodeKey, match="holds no key"):
        node_keyring_from_env({KEY_FILE_ENV: str(file)})
    with pytest.raises(MissingNodeKey, match="cannot read"):
        node_keyring_from_env({KEY_FILE_ENV: str(tmp_path / "absent")})
    with pytest.raises(EvschedError, match="at least 32"):
        node_keyring_from_env({KEY_ENV: "short"})


def test_keys_never_show_in_a_repr() -> None:
    ring = NodeKeyring(NEW, [OLD])
    assert NEW not in repr(ring) and OLD not in str(ring)
    assert repr(ring) == "NodeKeyring(<2 keys redacted>)"
