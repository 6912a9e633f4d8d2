"""``evsched outbox init|status`` on real PostgreSQL (init is idempotent, even run concurrently),
and the database ``evsched dev --with-postgres`` starts."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from tests.conftest import unique_name
from typer.testing import CliRunner

from evsched.cli import app as evsched
from evsched.cli.dev import DevStack
from evsched.outbox import init_table_sync

pytestmark = [pytest.mark.timeout(120)]
runner = CliRunner()


def test_init_twice_and_at_once_makes_one_table_and_status_counts_its_rows(
    postgres_dsn: str,
) -> None:
    table = unique_name("ob_cli_")
    first = runner.invoke(evsched, ["outbox", "init", "--dsn", postgres_dsn, "--table", table])
    assert first.exit_code == 0, first.output
    assert f"outbox table {table} ready" in first.output
    with ThreadPoolExecutor(4) as pool:  # four deploys racing their migration
        list(pool.map(lambda _: init_table_sync(postgres_dsn, table), range(4)))
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{table}" (job_id, event) VALUES (%s, %s), (%s, %s)',
            ("a", b"\x00", "b", b"\x01"),
        )
        triggers = conn.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass", (table,)
        ).fetchone()
    assert triggers == (1,)
    again = runner.invoke(evsched, ["outbox", "init", "--dsn", postgres_dsn, "--table", table])
    assert again.exit_code == 0, again.output
    status = runner.invoke(
        evsched, ["outbox", "status", "--dsn", postgres_dsn, "--table", table, "--json"]
    )
    assert status.exit_code == 0, status.output
    document = json.loads(status.stdout)
    assert (document["table"], document["pending"]) == (table, 2)  # init kept the rows
    assert document["oldest_s"] >= 0


def test_status_of_a_table_that_was_never_made_says_so(postgres_dsn: str) -> None:
    missing = runner.invoke(
        evsched, ["outbox", "status", "--dsn", postgres_dsn, "--table", "never_made"]
    )
    assert missing.exit_code == 4, missing.output
    assert "never_made" in missing.output and "does not exist" in missing.output


def test_dev_with_postgres_starts_a_database_with_the_outbox_table_and_removes_it(
    tmp_path: Path, postgres_dsn: str
) -> None:
    stack = DevStack(app="examples.app:app", data_dir=tmp_path, with_postgres=True)
    dsn = stack._start_postgres()
    try:
        assert dsn != postgres_dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM evsched_outbox").fetchone() == (0,)
    finally:
        stack._stop_postgres()
    assert stack.postgres is not None
    assert not stack.postgres.data_dir.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)
