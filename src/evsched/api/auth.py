"""Who may call the API: a write token and an optional read token, from the environment or files.

Secrets never come from the command line (``ps`` shows it) and never show in a repr. An API
without a write token must be asked for explicitly (``--no-auth``): an empty variable is not
a way to turn authentication off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

WRITE_ENV = "EVSCHED_API_TOKEN"
READ_ENV = "EVSCHED_API_READ_TOKEN"


class AuthConfigError(ValueError):
    """The API's auth settings are missing or contradict each other: it must not start."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Tokens:
    """``write`` may do anything; ``read`` may only read. Reads are open unless ``guard_reads``."""

    write: str | None = field(default=None, repr=False)
    read: str | None = field(default=None, repr=False)
    auth_reads: bool = False

    def __post_init__(self) -> None:
        if self.write == "" or self.read == "":
            raise AuthConfigError("an empty token would turn authentication off: use None")
        if self.read is not None and self.write is None:
            raise AuthConfigError("a read token needs a write token too")

    @property
    def guard_reads(self) -> bool:
        return self.write is not None and (self.auth_reads or self.read is not None)

    def __repr__(self) -> str:
        return (
            f"Tokens(write={'set' if self.write else None}, "
            f"read={'set' if self.read else None}, guard_reads={self.guard_reads})"
        )


def load_tokens(
    env: Mapping[str, str],
    *,
    token_file: Path | None = None,
    read_token_file: Path | None = None,
    auth_reads: bool = False,
    no_auth: bool = False,
) -> Tokens:
    """The tokens ``evsched api`` serves with; AuthConfigError when it must refuse to start."""
    write = _secret(WRITE_ENV, env, token_file, "--token-file")
    read = _secret(READ_ENV, env, read_token_file, "--read-token-file")
    if no_auth:
        if write is not None or read is not None or auth_reads:
            raise AuthConfigError("--no-auth contradicts the token settings given: drop one")
        return Tokens()
    if write is None:
        raise AuthConfigError(
            f"no write token: set {WRITE_ENV} (or --token-file, a file holding it), "
            "or pass --no-auth to serve without authentication"
        )
    return Tokens(write=write, read=read, auth_reads=auth_reads)


def _secret(name: str, env: Mapping[str, str], path: Path | None, option: str) -> str | None:
    value = env.get(name, "").strip()
    if path is None:
        return value or None
    if value:
        raise AuthConfigError(f"both {name} and {option} are set: use one")
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthConfigError(f"{option} {path}: cannot read it ({exc})") from None
    if not value:
        raise AuthConfigError(f"{option} {path} is empty")
    return value
