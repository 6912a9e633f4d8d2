"""Dispatch records are authenticated: a worker holding the key runs only what a node signed."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from evsched.adapters.avro import encode_dispatch
from evsched.adapters.signing import (
    KEY_ENV,
    KEY_FILE_ENV,
    SIGNATURE_HEADER,
    UNSIGNED_ENV,
    DispatchKey,
    MissingDispatchKey,
    dispatch_key_from_env,
)
from evsched.client import Context
from evsched.core.events import AttemptStarted, AttemptSucceeded
from evsched.errors import EvschedError
from evsched.metrics import WorkerInstruments
from tests.unit.worker_rig import Rig, make_rig

SECRET = "k" * 40
KEY = DispatchKey(SECRET)


@pytest.fixture
def rig() -> Rig:
    return make_rig()


def test_a_signature_binds_the_value_and_the_topic() -> None:
    value = b"\xc3\x01payload"
    header = KEY.header("ns.dispatch.a", value)
    assert header[0] == SIGNATURE_HEADER
    assert KEY.check("ns.dispatch.a", value, [header]) is None
    assert KEY.check("ns.dispatch.b", value, [header]) == "forged"
    assert KEY.check("ns.dispatch.a", value + b"x", [header]) == "forged"
    assert DispatchKey("x" * 40).check("ns.dispatch.a", value, [header]) == "forged"
    assert KEY.check("ns.dispatch.a", value, [header, header]) == "forged"
    assert KEY.check("ns.dispatch.a", value, [("other", b"")]) == "unsigned"


def test_the_key_never_shows_in_a_repr_or_str() -> None:
    assert SECRET not in repr(KEY)
    assert SECRET not in str(KEY)
    assert SECRET not in repr([KEY])


def test_a_short_key_is_refused() -> None:
    with pytest.raises(EvschedError, match="at least 32"):
        DispatchKey("short")


def test_generated_keys_are_long_and_fresh() -> None:
    first, second = DispatchKey.generate(), DispatchKey.generate()
    assert len(first) >= 32 and first != second
    DispatchKey(first)


def test_the_key_comes_from_a_file_first_then_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(SECRET + "\n")
    value = b"v"
    from_file = dispatch_key_from_env({KEY_FILE_ENV: str(path), KEY_ENV: "y" * 40})
    assert from_file is not None and from_file.check("t", value, [KEY.header("t", value)]) is None
    from_env = dispatch_key_from_env({KEY_ENV: SECRET})
    assert from_env is not None and from_env.check("t", value, [KEY.header("t", value)]) is None


def test_an_unreadable_key_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(MissingDispatchKey, match="cannot read"):
        dispatch_key_from_env({KEY_FILE_ENV: str(tmp_path / "absent")})


def test_without_a_key_only_the_explicit_opt_out_starts() -> None:
    with pytest.raises(MissingDispatchKey, match=UNSIGNED_ENV):
        dispatch_key_from_env({})
    with pytest.raises(MissingDispatchKey):
        dispatch_key_from_env({UNSIGNED_ENV: "0"})
    assert dispatch_key_from_env({UNSIGNED_ENV: "1"}) is None
    assert dispatch_key_from_env({UNSIGNED_ENV: "true"}) is None


async def test_a_worker_with_a_key_refuses_unsigned_and_forged_records(rig: Rig) -> None:
    ran: list[str] = []

    @rig.app.task(name="charge")
    async def charge(ctx: Context, amount: int) -> None:
        ran.append(ctx.job_id)

    unsigned = rig.send("charge", 1)
    forged = rig.send("charge", 2, signed_by=DispatchKey("f" * 40))
    genuine = rig.dispatch("charge", 3)
    tampered = encode_dispatch(genuine).replace(b"[3]", b"[9]")
    rig.feed.put(tampered, headers=(KEY.header(rig.feed.topic, encode_dispatch(genuine)),))
    signed = rig.send("charge", 4, signed_by=KEY)
    registry = CollectorRegistry()
    with capture_logs() as logs:
        async with rig.worker(dispatch_key=KEY, instruments=WorkerInstruments(registry)):
            assert isinstance(await rig.outcome(signed.job_id), AttemptSucceeded)

    assert ran == [signed.job_id]
    assert {e.job_id for e in rig.log.events(AttemptStarted)} == {signed.job_id}
    refused = [(e["offset"], e["reason"]) for e in logs if e["event"] == "dispatch_unauthenticated"]
    assert refused == [(0, "unsigned"), (1, "forged"), (2, "forged")]
    assert {unsigned.job_id, forged.job_id} & {e.job_id for e in rig.log.events()} == set()
    counts = {
        reason: registry.get_sample_value(
            "evsched_worker_dispatches_skipped_total", {"reason": reason}
        )
        for reason in ("unsigned", "forged")
    }
    assert counts == {"unsigned": 1, "forged": 2}
    assert [r.offset for r in rig.feed.committed] == [0, 1, 2, 3]
