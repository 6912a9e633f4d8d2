"""Every ``evsched`` command that README.md and docs/ show exists, with every option it is shown
with: a renamed or removed command, sub-command or option fails here, not in a reader's shell.

The commands are the lines of fenced ``sh``/``bash``/``console``/``shell`` blocks and the inline
code spans that start with ``evsched`` (after ``$ `` prompts and ``VAR=value`` prefixes; a line
ending in ``\\`` goes on with the next). Each one's command path is resolved against the Typer
app, ``evsched <path> --help`` must exit 0, and each ``--option`` (or ``-o``) of the line must be
in that help. Nothing is run. Read as shell words with comments dropped and cut at ``|``, ``;``
or ``&&``; ``…`` or ``...`` standing alone elides arguments and is skipped; ``[`` and ``]`` (an
optional part) are dropped; ``a / b`` and ``a/b`` in the command's words are alternatives
(``evsched kafka up / down`` is ``evsched kafka up`` and ``evsched kafka down``). Skipped: a bare
``evsched`` (the default namespace) and a span whose first word ends in ``:`` (a quoted message).
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from evsched.cli import app

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*```(\w*)\s*$")
SHELLS = {"sh", "bash", "console", "shell"}
SPAN = re.compile(r"`([^`]+)`")
COMMAND = re.compile(r"^(?:\w+=\S+\s+)*(evsched\s+\S.*)$")
ELIDED = {"…", "..."}
USAGE = re.compile(r"Usage: evsched((?: [a-z][\w-]*)*)")
runner = CliRunner()


@dataclass(frozen=True, slots=True)
class Documented:
    """A command line as a document shows it, and where."""

    where: str
    line: str


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
    found: list[Documented] = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(ROOT).as_posix()
        for number, line in [*shell_lines(text), *spans(text)]:
            command = COMMAND.match(line)
            if command is None or command[1].split()[1].endswith(":"):
                continue
            found += [Documented(f"{name}:{number}", alt) for alt in alternatives(command[1])]
    return found


def words(line: str) -> list[str]:
    """The command's words after ``evsched``: comments, pipes, elisions and brackets left out."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|;&")
    lexer.whitespace_split = True
    taken: list[str] = []
    for raw in lexer:
        if raw in {"|", ";", "&&", "||", "&"}:
            break
        word = raw.strip("[]")
        if word and word not in ELIDED:
            taken.append(word)
    return taken[1:]


def options(tokens: list[str]) -> list[str]:
    return [t.split("=", 1)[0] for t in tokens if re.fullmatch(r"--?[a-zA-Z][\w-]*(=.*)?", t)]


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


def test_the_docs_show_commands_in_blocks_and_in_prose() -> None:
    where = {d.where.split(":")[0] for d in DOCS_COMMANDS}
    assert {"README.md", "docs/operator.md", "docs/operations.md"} <= where
    lines = {d.line for d in DOCS_COMMANDS}
    assert "evsched kafka down" in lines  # from `evsched kafka up / down / status / topics`
    assert any(line.startswith("evsched enqueue billing.send_receipt") for line in lines)


def test_shell_lines_join_continuations_and_drop_prompts() -> None:
    text = "```console\n$ evsched jobs \\\n    --limit 2   # two\n```\n```python\nevsched x\n```"
    assert shell_lines(text) == [(3, "evsched jobs --limit 2   # two")]
    assert words("evsched jobs --json | jq . # all") == ["jobs", "--json"]
    assert words("evsched workflow requeue ID [--dry-run] …") == [
        "workflow",
        "requeue",
        "ID",
        "--dry-run",
    ]


DOCS_COMMANDS = documented()


@pytest.mark.parametrize("doc", DOCS_COMMANDS, ids=lambda d: d.where)
def test_a_documented_command_exists_with_its_options(doc: Documented) -> None:
    tokens = words(doc.line)
    path = command_path(tokens)
    code, output = help_of(path)
    assert code == 0, f"{doc.where}: `{doc.line}`: evsched {' '.join(path)} --help:\n{output}"
    declared = {o for p in command_at(path).params for o in (*p.opts, *p.secondary_opts)}
    missing = [
        option
        for option in options(tokens)
        if option not in declared
        or not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", output)
    ]
    assert not missing, f"{doc.where}: `{doc.line}`: evsched {' '.join(path)} has no {missing}"
