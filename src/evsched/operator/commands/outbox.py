"""``evsched outbox init|status --dsn``: the PostgreSQL outbox table that ``evsched relay`` drains.

psycopg comes with the ``outbox`` extra, so it is imported when a command runs, never when the
command line starts: ``evsched`` works without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.render import emit_json, out
from evsched.operator.session import Json, guarded

if TYPE_CHECKING:
    from types import ModuleType

DSN_ENV = "EVSCHED_OUTBOX_DSN"
EXTRA_HINT = "the outbox needs psycopg: pip install 'evsched[outbox]'"

Dsn = Annotated[
    str,
    typer.Option(
        "--dsn",
        envvar=DSN_ENV,
        help="The application's database, e.g. postgresql://user@host:5432/db.",
        show_default=False,
    ),
]
Table = Annotated[str, typer.Option("--table", help="The outbox table (a lower-case identifier).")]


def outbox_schema() -> ModuleType:
    """``evsched.outbox.schema``, or a usage error naming the extra to install."""
    try:
        from evsched.outbox import schema  # noqa: PLC0415
    except ImportError as exc:
        raise OperatorError(ExitCode.USAGE, f"{EXTRA_HINT} ({exc})") from None
    return schema


def outbox_init(*, dsn: Dsn, table: Table = "evsched_outbox") -> None:
    """Create the outbox table and its NOTIFY trigger; running it again changes nothing."""

    def main() -> ExitCode:
        schema = outbox_schema()
        _create(schema, dsn, table)
        out.print(f"outbox table {table} ready")
        return ExitCode.OK

    guarded(main)


def outbox_status(*, dsn: Dsn, table: Table = "evsched_outbox", as_json: Json = False) -> None:
    """Rows waiting for the relay, and the oldest one's age."""

    def main() -> ExitCode:
        schema = outbox_schema()
        try:
            found = schema.backlog_sync(dsn, table)
        except (schema.OutboxDatabaseError, ValueError) as exc:
            raise OperatorError(ExitCode.UNAVAILABLE, str(exc)) from None
        if as_json:
            emit_json({"table": table, "pending": found.rows, "oldest_s": found.oldest_s})
        else:
            out.print(f"{table}: {found.rows} rows pending, oldest {found.oldest_s:.1f} s")
        return ExitCode.OK

    guarded(main)


def _create(schema: ModuleType, dsn: str, table: str) -> None:
    try:
        schema.init_table_sync(dsn, table)
    except ValueError as exc:  # InvalidTable
        raise OperatorError(ExitCode.USAGE, str(exc)) from None
    except schema.OutboxDatabaseError as exc:
        raise OperatorError(ExitCode.UNAVAILABLE, str(exc)) from None


def outbox_app() -> typer.Typer:
    app = typer.Typer(
        no_args_is_help=True, help="The PostgreSQL outbox: enqueue with your database write."
    )
    app.command("init")(outbox_init)
    app.command("status")(outbox_status)
    return app
