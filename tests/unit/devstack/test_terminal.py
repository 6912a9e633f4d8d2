"""The dev stack's terminal: every line behind its process's name, whole, coloured only on a TTY.

The children here are real processes writing to real pipes, in pieces, at the same time.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from evsched.cli.dev import NAMES, DevStack
from evsched.devstack.terminal import SEPARATOR, Terminal

ESC = "\x1b["
LINES = 300

# Writes each line in three pieces straight to fd 1 (no buffer joins them), then a last line
# without its newline: a child that died mid-line.
PIECES = textwrap.dedent(
    """
    import os, sys
    tag = sys.argv[1]
    for n in range({lines}):
        for piece in (f"{{tag}}-{{n}}-", "x" * 50, f"-end-{{n}}\\n"):
            os.write(1, piece.encode())
    os.write(1, f"{{tag}}-last".encode())
    """
).format(lines=LINES)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "COLORTERM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")


def run_children(terminal: Terminal, tags: dict[str, str]) -> None:
    children = {
        name: subprocess.Popen(
            [sys.executable, "-c", PIECES, tag], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        for name, tag in tags.items()
    }
    threads = []
    for name, child in children.items():
        assert child.stdout is not None
        threads.append(terminal.follow(name, child.stdout))
    for child in children.values():
        assert child.wait(timeout=60) == 0
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()


@pytest.mark.usefixtures("plain_env")
def test_lines_written_in_pieces_by_two_children_come_out_whole_behind_their_names() -> None:
    out = io.StringIO()
    terminal = Terminal(["worker", "api"], out)
    run_children(terminal, {"worker": "w", "api": "a"})
    lines = out.getvalue().split("\n")
    assert lines.pop() == ""  # every line ends with a newline, the last one included
    whole = re.compile(rf"^(worker|api   ) {SEPARATOR} ([wa])-(\d+)-x{{50}}-end-(\d+)$")
    seen: Counter[str] = Counter()
    for line in lines:
        if line.endswith("-last"):
            name, _, text = line.partition(f" {SEPARATOR} ")
            assert text == {"worker": "w-last", "api": "a-last"}[name.strip()]
            seen[f"{name.strip()}-last"] += 1
            continue
        match = whole.match(line)
        assert match is not None, f"a broken or unnamed line: {line!r}"
        name, tag, n, end = match.groups()
        assert {"worker": "w", "api": "a"}[name.strip()] == tag  # the line is its writer's
        assert n == end
        seen[name.strip()] += 1
    assert seen == {"worker": LINES, "api": LINES, "worker-last": 1, "api-last": 1}
    assert ESC not in out.getvalue()


@pytest.mark.usefixtures("plain_env")
def test_prefixes_have_one_width_and_colour_only_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = io.StringIO()
    Terminal(["node", "worker", "api"], plain).write("api", "ready\nlistening")
    assert plain.getvalue() == f"api    {SEPARATOR} ready\napi    {SEPARATOR} listening\n"

    tty = Tty()
    coloured = Terminal(["node", "worker", "api"], tty)
    assert coloured.colour
    coloured.write("worker", "job_succeeded")
    line = tty.getvalue()
    assert line.startswith(ESC)
    assert line.endswith(f"worker {SEPARATOR} \x1b[0mjob_succeeded\n")  # the text is left as it is

    monkeypatch.setenv("NO_COLOR", "1")  # no-color.org: even on a terminal
    tty = Tty()
    Terminal(["node", "worker"], tty).write("node", "up")
    assert tty.getvalue() == f"node   {SEPARATOR} up\n"

    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("FORCE_COLOR", "1")  # force-color.org: even into a pipe or a file
    assert Terminal(["node"], io.StringIO()).colour


@pytest.mark.usefixtures("plain_env")
def test_children_are_told_whether_to_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"FORCE_COLOR": "1"}
    Terminal(["node"], io.StringIO()).child_env(env)
    assert env == {"NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}
    env = {"NO_COLOR": ""}
    Terminal(["node"], Tty()).child_env(env)
    assert env == {"FORCE_COLOR": "1", "PYTHONUNBUFFERED": "1"}


@pytest.mark.usefixtures("plain_env")
def test_the_dev_stack_puts_a_childs_output_and_errors_behind_its_name(tmp_path: Path) -> None:
    out = io.StringIO()
    stack = DevStack(app="examples.app:app", data_dir=tmp_path, terminal=Terminal(NAMES, out))
    script = "import sys; print('enqueued'); print('oops', file=sys.stderr)"
    child = stack._start("demo", [sys.executable, "-c", script], stack.env("127.0.0.1:1"))
    assert child.wait(timeout=60) == 0
    for follower in stack.followers:
        follower.join(timeout=30)
    # Unbuffered (PYTHONUNBUFFERED from child_env): the two lines keep the order they had.
    assert out.getvalue() == f"demo   {SEPARATOR} enqueued\ndemo   {SEPARATOR} oops\n"
