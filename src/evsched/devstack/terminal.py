"""The dev stack's terminal: each process's lines behind its name, whole lines only.

``evsched dev`` runs several processes on one terminal. Their output comes through pipes and is
written here a whole line at a time, under a lock, behind a fixed-width column naming the process
(``worker │ ...``), in colour only when the terminal takes it (rich decides: a TTY, ``NO_COLOR``,
``FORCE_COLOR``, ``TERM=dumb``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, MutableMapping, Sequence
from typing import IO, TextIO

from rich.color import ColorSystem
from rich.style import Style

from evsched.logging import colour_wanted

SEPARATOR = "│"
# One colour per name, in the order the names are given: rich's names of the 16 ANSI colours.
COLOURS = ("cyan", "yellow", "green", "magenta", "blue", "bright_cyan", "bright_yellow")


class Terminal:
    """Writes lines of named processes to ``stream``, each behind ``name │``."""

    def __init__(self, names: Sequence[str], stream: TextIO | None = None) -> None:
        self._stream = sys.stdout if stream is None else stream
        self.colour = colour_wanted(self._stream)
        width = max(len(name) for name in names)
        self._prefixes = {
            name: self._render(f"{name:<{width}} {SEPARATOR} ", COLOURS[i % len(COLOURS)])
            for i, name in enumerate(names)
        }
        self._lock = threading.Lock()

    def _render(self, prefix: str, colour: str) -> str:
        if not self.colour:
            return prefix
        # The 16 colours of every ANSI terminal are all it uses.
        return Style(color=colour).render(prefix, color_system=ColorSystem.STANDARD)

    def child_env(self, env: MutableMapping[str, str]) -> None:
        """Tell the children in ``env`` (which write to a pipe) whether to colour their lines."""
        if self.colour:
            env.pop("NO_COLOR", None)
            env["FORCE_COLOR"] = "1"
        else:
            env.pop("FORCE_COLOR", None)
            env["NO_COLOR"] = "1"
        # Lines as they are printed, not a pipe's 8 KiB later (Python children).
        env["PYTHONUNBUFFERED"] = "1"

    def write(self, name: str, text: str) -> None:
        """Each line of ``text`` behind ``name``'s prefix; no other line can come between."""
        prefix = self._prefixes[name]
        lines = text.splitlines() or [""]
        block = "".join(f"{prefix}{line}\n" for line in lines)
        with self._lock:
            self._stream.write(block)
            self._stream.flush()

    def follow(self, name: str, pipe: IO[bytes]) -> threading.Thread:
        """Copy ``pipe`` line by line until it closes, on a thread of its own (returned)."""
        thread = threading.Thread(
            target=self._copy, args=(name, pipe), name=f"terminal-{name}", daemon=True
        )
        thread.start()
        return thread

    def _copy(self, name: str, pipe: IO[bytes]) -> None:
        with pipe:
            for raw in _lines(pipe):
                # A child's bytes need not be UTF-8; one bad byte must not stop its output.
                self.write(name, raw.decode("utf-8", errors="replace").rstrip("\r\n"))


def _lines(pipe: IO[bytes]) -> Iterable[bytes]:
    # readline waits for the newline: a line written in pieces comes out whole. The last one
    # may lack its newline (a child that died mid-line) and still comes out.
    return iter(pipe.readline, b"")
