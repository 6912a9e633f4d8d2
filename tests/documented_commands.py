"""The ``evsched`` commands that README.md and docs/ show, read as the unit and integration tests
of the docs both read them (tests/unit/docs/test_doc_commands.py checks them against ``--help``,
tests/integration/test_doc_commands_run.py runs them on a real stack).

The commands are the lines of fenced ``sh``/``bash``/``console``/``shell`` blocks and the inline
code spans that start with ``evsched`` (after ``$ `` prompts and ``VAR=value`` prefixes; a line
ending in ``\\`` goes on with the next). Read as shell words with comments dropped and cut at
``|``, ``;`` or ``&&``; ``…`` or ``...`` standing alone elides arguments and is skipped; ``[`` and
``]`` (an optional part) are dropped; ``a / b`` and ``a/b`` in the command's words are
alternatives (``evsched kafka up / down`` is ``evsched kafka up`` and ``evsched kafka down``).
Skipped: a bare ``evsched`` (the default namespace) and a span whose first word ends in ``:`` (a
quoted message).
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from evsched.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*```(\w*)\s*$")
SHELLS = {"sh", "bash", "console", "shell"}
SPAN = re.compile(r"`([^`]+)`")
COMMAND = re.compile(r"^(?:\w+=\S+\s+)*(evsched\s+\S.*)$")
ELIDED = {"…", "..."}
USAGE = re.compile(r"Usage: evsched((?: [a-z][\w-]*)*)")
QUOTED = re.compile(r"['\"]")
OPTION = re.compile(r"--?[a-zA-Z][\w-]*(=.*)?")
runner = CliRunner()


@dataclass(frozen=True, slots=True)
class Documented:
    """A command line as a document shows it, and where; ``fenced``: in a shell block (a
    command to type), else an inline span of the prose."""

    where: str
    line: str
    fenced: bool


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the fenced shell blocks, continuations joined, prompts taken off."""
    found: list[tuple[int, str]] = []
    lang: str | None = None
    pending = ""
    for number, raw in enumerate(text.splitlines(), 1):
        if fence := FENCE.match(raw):
            lang = None if lang is not None else fence[1]
            continue
        if lang not in SHELLS:
            continue
        line, pending = f"{pending} {raw.strip().removeprefix('$ ')}".strip(), ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        found.append((number, line))
    return found


def spans(text: str) -> list[tuple[int, str]]:
    """(line number, span) of the inline code outside fences; a span may cross a line break."""
    prose = []
    inside = False
    for raw in text.splitlines():
        if FENCE.match(raw):
            inside = not inside
        prose.append("" if inside or FENCE.match(raw) else raw)
    joined = "\n".join(prose)
    return [
        (joined.count("\n", 0, m.start()) + 1, " ".join(m[1].split()))
        for m in SPAN.finditer(joined)
    ]


def alternatives(line: str) -> list[str]:
    """``evsched kafka up / down`` and ``evsched enqueue/cancel`` as one line per command."""
    head = line.split(" #", 1)[0]
    if " / " in head:
        first, *others = head.split(" / ")
        stem = first.rsplit(" ", 1)[0]
        return [first, *(f"{stem} {other}" for other in others)]
    words = head.split()
    if len(words) >= 2 and re.fullmatch(r"[a-z]+(?:/[a-z]+)+", words[1]):
        return [" ".join(["evsched", name, *words[2:]]) for name in words[1].split("/")]
    return [line]


def documented() -> list[Documented]:
    """Every command line of README.md and docs/, in document order, blocks before spans."""
    found: list[Documented] = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(ROOT).as_posix()
        for fenced, lines in ((True, shell_lines(text)), (False, spans(text))):
            for number, line in lines:
                command = COMMAND.match(line)
                if command is None or command[1].split()[1].endswith(":"):
                    continue
                found += [
                    Documented(f"{name}:{number}", alt, fenced) for alt in alternatives(command[1])
                ]
    return found


def words(line: str) -> list[str]:
    """The command's words after ``evsched``: comments, pipes, elisions and brackets left out."""
    lexer = shlex.shlex(line, posix=False, punctuation_chars="|;&")
    lexer.whitespace_split = True
    taken: list[str] = []
    for raw in lexer:
        if raw in {"|", ";", "&&", "||", "&"}:
            break
        # A quoted word is an argument as written (`'[]'` is JSON); brackets around a bare one
        # mark an optional part.
        word = "".join(shlex.split(raw)) if QUOTED.search(raw) else raw.strip("[]")
        if word and word not in ELIDED:
            taken.append(word)
    return taken[1:]


def options(tokens: list[str]) -> list[str]:
    return [t.split("=", 1)[0] for t in tokens if OPTION.fullmatch(t)]


@functools.cache
def root() -> Any:
    return typer.main.get_command(app)


@functools.cache
def help_of(path: tuple[str, ...]) -> tuple[int, str]:
    result = runner.invoke(app, [*path, "--help"], prog_name="evsched", env={"COLUMNS": "250"})
    return result.exit_code, result.output


def command_at(path: tuple[str, ...]) -> Any:
    command = root()
    for name in path:
        command = command.commands[name]
    return command


def command_path(tokens: list[str]) -> tuple[str, ...]:
    """The sub-commands ``tokens`` name; a word a group does not know is asked of the app (a
    group may read it as its default sub-command's argument: ``evsched workflow ID``)."""
    command = root()
    path: tuple[str, ...] = ()
    for token in tokens:
        subcommands = getattr(command, "commands", None)
        if not subcommands or token.startswith("-"):
            break
        if token in subcommands:
            path, command = (*path, token), subcommands[token]
            continue
        code, output = help_of((*path, token))
        assert code == 0, f"evsched {' '.join(path)} has no sub-command {token!r}:\n{output}"
        usage = USAGE.search(output)
        assert usage is not None, output
        return tuple(usage[1].split())
    return path


def names_a_command(doc: Documented, path: tuple[str, ...], tokens: list[str]) -> bool:
    """Whether ``doc`` is prose naming a command (``evsched audit``, ``evsched enqueue
    --no-wait``, ``evsched kafka topics --replication-factor``) rather than one to type: a span
    of the command's path and option names only, that would not run as it stands (a group, a
    command that takes arguments, or that requires an option or an option's value)."""
    # `evsched workflow ID` resolves to (workflow, show): only the words typed are the path.
    pairs = enumerate(zip(tokens, path, strict=False))
    typed = next((i for i, (word, name) in pairs if word != name), len(path))
    rest = tokens[typed:]
    if doc.fenced or not all(OPTION.fullmatch(t) for t in rest):
        return False
    command = command_at(path)
    if getattr(command, "commands", None):  # a group: Typer's own click, so no isinstance
        return True
    named = {o.split("=", 1)[0] for o in rest}
    return any(
        p.param_type_name == "argument"
        or p.required
        or (not getattr(p, "is_flag", False) and named & {*p.opts, *p.secondary_opts})
        for p in command.params
    )
