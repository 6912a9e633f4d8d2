"""Every ``evsched`` command that README.md and docs/ show exists, with every option it is shown
with: a renamed or removed command, sub-command or option fails here, not in a reader's shell.

How the commands are read from the docs: ``tests/documented_commands.py`` (shared with
tests/integration/test_doc_commands_run.py, which runs them). Each one's command path is
resolved against the Typer app, ``evsched <path> --help`` must exit 0, and each ``--option`` (or
``-o``) of the line must be in that help. Nothing is run.
"""

from __future__ import annotations

import re

import pytest

from tests.documented_commands import (
    Documented,
    command_at,
    command_path,
    documented,
    help_of,
    names_a_command,
    options,
    shell_lines,
    words,
)


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


def test_prose_that_names_a_command_is_told_from_one_to_type() -> None:
    def names(line: str, *, fenced: bool = False) -> bool:
        tokens = words(line)
        return names_a_command(Documented("x", line, fenced), command_path(tokens), tokens)

    assert names("evsched audit") and names("evsched dlq") and names("evsched enqueue --no-wait")
    assert names("evsched kafka topics --replication-factor")
    assert not names("evsched audit", fenced=True)  # in a shell block: a command to type
    assert not names("evsched rebuild") and not names("evsched jobs --status running")
    assert not names("evsched export --partition P --from OFFSET")


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
