"""Who may call the API: a write token and an optional read token, from the environment or files.

Secrets never come from the command line (``ps`` shows it) and never show in a repr. An API
without a write token must be asked for explicitly (``--no-auth``): an empty variable is not
a way to turn authentication off. A token shorter than ``MIN_TOKEN_CHARS``, or a read token that
is the write token (its holders could write), stops the API at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

WRITE_ENV = "EVSCHED_API_TOKEN"
READ_ENV = "EVSCHED_API_READ_TOKEN"
# Guessable below this; `openssl rand -hex 32` (the docs' advice) makes 64 characters.
MIN_TOKEN_CHARS = 16


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
        for role, token in (("write", self.write), ("read", self.read)):
            if token is not None and (refusal := weakness(token)) is not None:
                raise AuthConfigError(f"the {role} token {refusal}")
        if self.read is not None and self.read == self.write:
            raise AuthConfigError("the read token must differ from the write token")

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
    write, write_from = _secret(WRITE_ENV, env, token_file, "--token-file")
    read, read_from = _secret(READ_ENV, env, read_token_file, "--read-token-file")
    if no_auth:
        if write is not None or read is not None or auth_reads:
            raise AuthConfigError("--no-auth contradicts the token settings given: drop one")
        return Tokens()
    if write is None:
        raise AuthConfigError(
            f"no write token: set {WRITE_ENV} (or --token-file, a file holding it), "
            "or pass --no-auth to serve without authentication"
        )
    for token, source in ((write, write_from), (read, read_from)):
        if token is not None and (refusal := weakness(token)) is not None:
            raise AuthConfigError(f"{source} {refusal}")
    if read is not None and read == write:
        raise AuthConfigError(
            f"{read_from} holds the write token ({write_from}): a read token must differ, "
            "or its holders could write"
        )
    return Tokens(write=write, read=read, auth_reads=auth_reads)


def weakness(token: str) -> str | None:
    """Why ``token`` is too weak to guard the API (said without showing it), or None."""
    if len(token) < MIN_TOKEN_CHARS:
        return (
            f"has {len(token)} characters; a token needs at least {MIN_TOKEN_CHARS} "
            "(e.g. `openssl rand -hex 32`)"
        )
    return None


def _secret(
    name: str, env: Mapping[str, str], path: Path | None, option: str
) -> tuple[str | None, str]:
    """The token and where it came from (the variable, or the option and its file)."""
    value = env.get(name, "").strip()
    if path is None:
        return value or None, name
    if value:
        raise AuthConfigError(f"both {name} and {option} are set: use one")
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthConfigError(f"{option} {path}: cannot read it ({exc})") from None
    if not value:
        raise AuthConfigError(f"{option} {path} is empty")
    return value, f"{option} {path}"
