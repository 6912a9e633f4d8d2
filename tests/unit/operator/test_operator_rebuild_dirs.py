"""``evsched rebuild --replace`` deletes only what a rebuild made (issue 9, D.12): never an
unrelated directory, never a node's index, never an index another process has open."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from evsched.adapters.index.store import PartitionIndex
from evsched.operator import rebuild_dirs
from evsched.operator.rebuild_dirs import MARKER, NotOurs, check_replaceable, lock_held

HOLD_INDEX = """
import sys, pathlib
from evsched.adapters.index.store import PartitionIndex
index = PartitionIndex(pathlib.Path(sys.argv[1]), 0)
print("open", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Path]:
    """A marked rebuild directory whose p0000 index another process (a 'node') has open."""
    rebuild_dirs.mark(tmp_path / "rebuilt")
    path = tmp_path / "rebuilt" / "p0000"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_INDEX, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "open"
        yield tmp_path / "rebuilt"
    finally:
        holder.communicate("", timeout=30)


def make_index(path: Path) -> None:
    PartitionIndex(path, 0).close()


def test_an_unrelated_directory_is_refused_by_the_command_and_kept(
    cli: typer.Typer, tmp_path: Path
) -> None:
    mine = tmp_path / "important"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    result = CliRunner().invoke(cli, ["rebuild", "--data-dir", str(mine), "--replace"])
    assert result.exit_code == 2, result.output
    assert "not made by `evsched rebuild`" in " ".join(result.output.split())
    assert (mine / "thesis.tex").read_text() == "years of work"


def test_a_node_data_dir_is_not_a_rebuild(tmp_path: Path) -> None:
    make_index(tmp_path / "node" / "p0000")
    with pytest.raises(NotOurs, match=r"no \.evsched-rebuild file"):
        check_replaceable(tmp_path / "node")


def test_a_live_index_is_never_deleted(cli: typer.Typer, held: Path) -> None:
    assert lock_held(held / "p0000")
    with pytest.raises(NotOurs, match=r"p0000 is open in another process"):
        check_replaceable(held)
    result = CliRunner().invoke(cli, ["rebuild", "--data-dir", str(held), "--replace"])
    assert result.exit_code == 2
    assert (held / "p0000" / "CURRENT").is_file()


def test_anything_else_inside_a_rebuild_is_named(tmp_path: Path) -> None:
    rebuild_dirs.mark(tmp_path / "r")
    make_index(tmp_path / "r" / "p0001")
    (tmp_path / "r" / "notes.txt").write_text("mine")
    with pytest.raises(NotOurs, match=r"notes.txt is not a partition index"):
        check_replaceable(tmp_path / "r")
    (tmp_path / "r" / "notes.txt").unlink()
    (tmp_path / "r" / "p0002").symlink_to(tmp_path)
    with pytest.raises(NotOurs, match=r"p0002 is not a partition index"):
        rebuild_dirs.replace(tmp_path / "r")


def test_a_rebuild_of_its_own_is_replaced(tmp_path: Path) -> None:
    rebuild_dirs.mark(tmp_path / "r")
    make_index(tmp_path / "r" / "p0000")
    assert (tmp_path / "r" / MARKER).is_file()
    assert not lock_held(tmp_path / "r" / "p0000")
    rebuild_dirs.replace(tmp_path / "r")
    assert not (tmp_path / "r").exists()
    rebuild_dirs.replace(tmp_path / "r")  # nothing there: nothing to do
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty")


def test_a_file_or_a_symlink_is_not_a_rebuild(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotOurs):
        check_replaceable(tmp_path / "f")
    rebuild_dirs.mark(tmp_path / "r")
    (tmp_path / "link").symlink_to(tmp_path / "r")
    with pytest.raises(NotOurs):
        check_replaceable(tmp_path / "link")
