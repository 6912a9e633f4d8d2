"""Who is looking at the dashboard: a signed session cookie from a login form, and CSRF tokens.

The cookie never holds a token: it holds the role the login proved (read or write), an expiry and
a random session id, signed with a key made at start-up, so restarting the API logs everyone out.
A logout revokes the session id on the server (kept until the cookie would have expired anyway),
so a copy of the cookie is dead too. It is HttpOnly and SameSite=Strict. Every form carries a CSRF
token derived from the session (or, without auth, from the anonymous session), checked on every
write; the login form carries one derived from a nonce cookie set when the form was served.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from enum import IntEnum

from evsched.adapters.clock import now_ms
from evsched.api.auth import Tokens

COOKIE = "evsched_session"
SESSION_S = 12 * 3600
# The login form's own CSRF pair (a nonce cookie and its signature in the form), so another
# site cannot log a browser in under the attacker's token.
LOGIN_COOKIE = "evsched_login"
LOGIN_FORM_S = 3600
# Logged-out sessions remembered at once (each until its expiry). Past it every session ends (a
# new key) rather than one revocation being forgotten: memory stays bounded, logouts stay final.
MAX_REVOKED = 10_000


class Role(IntEnum):
    NONE = 0
    READ = 1
    WRITE = 2


@dataclass(slots=True)
class Sessions:
    """Signs and checks session cookies and CSRF tokens for one API process."""

    tokens: Tokens = field(repr=False)
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    max_revoked: int = MAX_REVOKED
    # Session id -> its expiry (epoch s), for the sessions logged out before they expired.
    revoked: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def auth(self) -> bool:
        return self.tokens.write is not None

    def login(self, given: str) -> Role:
        """The role ``given`` proves; every token is compared (constant time)."""
        write, read = self.tokens.write, self.tokens.read
        is_write = write is not None and hmac.compare_digest(given.encode(), write.encode())
        is_read = read is not None and hmac.compare_digest(given.encode(), read.encode())
        if is_write:
            return Role.WRITE
        return Role.READ if is_read else Role.NONE

    def cookie(self, role: Role) -> str:
        expires = now_ms() // 1000 + SESSION_S
        body = f"{int(role)}.{expires}.{secrets.token_hex(16)}"
        return f"{body}.{self._sign('session', body)}"

    def role(self, cookie: str | None, bearer: str | None = None) -> Role:
        """The role of a request: everything without auth; else its cookie or bearer token."""
        if not self.auth:
            return Role.WRITE
        if bearer:
            return self.login(bearer)
        return self._cookie_role(cookie)

    def revoke(self, cookie: str | None) -> None:
        """End ``cookie``'s session on this server (a logout), whoever holds a copy of it."""
        session = self._session(cookie)
        if session is None:
            return
        _, expires, session_id = session
        if len(self.revoked) >= self.max_revoked:
            now_s = now_ms() // 1000
            self.revoked = {s: e for s, e in self.revoked.items() if e >= now_s}
        if len(self.revoked) >= self.max_revoked:
            self.key = secrets.token_bytes(32)  # every cookie and CSRF token signed so far dies
            self.revoked.clear()
            return
        self.revoked[session_id] = expires

    def can_read(self, role: Role) -> bool:
        return role >= Role.READ or not self.tokens.guard_reads

    def csrf(self, cookie: str | None) -> str:
        return self._sign("csrf", cookie if self.auth and cookie else "anonymous")

    def csrf_ok(self, cookie: str | None, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(self.csrf(cookie), given)

    @staticmethod
    def login_nonce() -> str:
        return secrets.token_hex(16)

    def login_csrf(self, nonce: str) -> str:
        return self._sign("login", nonce)

    def login_csrf_ok(self, nonce: str | None, given: str | None) -> bool:
        if not nonce or given is None:
            return False
        return hmac.compare_digest(self.login_csrf(nonce), given)

    def _cookie_role(self, cookie: str | None) -> Role:
        session = self._session(cookie)
        if session is None or session[2] in self.revoked:
            return Role.NONE
        return session[0]

    def _session(self, cookie: str | None) -> tuple[Role, int, str] | None:
        """(role, expiry, session id) of a cookie this server signed that has not expired."""
        if not cookie or cookie.count(".") != 3:
            return None
        body, signature = cookie.rsplit(".", 1)
        if not hmac.compare_digest(self._sign("session", body), signature):
            return None
        role, expires, session_id = body.split(".")
        if not role.isdigit() or not expires.isdigit() or int(expires) < now_ms() // 1000:
            return None
        return Role(min(int(role), Role.WRITE)), int(expires), session_id

    def _sign(self, purpose: str, text: str) -> str:
        return hmac.new(self.key, f"{purpose}\x00{text}".encode(), hashlib.sha256).hexdigest()
