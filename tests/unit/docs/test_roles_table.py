"""docs/security.md's table of who may state each kind is core.roles', row for row."""

from __future__ import annotations

import re
from pathlib import Path

from evsched.core import roles
from evsched.core.events import EVENT_TYPES, ScheduleFired

DOC = Path(__file__).resolve().parents[3] / "docs" / "security.md"
_ROW = re.compile(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \|$")


def _rows() -> dict[str, tuple[str, str]]:
    section = DOC.read_text().split("## Who may state what", 1)[1].split("\n## ", 1)[0]
    return {
        m[1]: (m[2].strip(), m[3].strip())
        for line in section.splitlines()
        if (m := _ROW.match(line))
    }


def test_the_docs_table_names_every_kind_with_its_roles_and_proof() -> None:
    rows = _rows()
    assert list(rows) == [cls.__name__ for cls in roles.STATED_BY]
    assert set(rows) == {cls.__name__ for cls in EVENT_TYPES}
    for cls, stated in roles.STATED_BY.items():
        said, proof = rows[cls.__name__]
        named = set(re.findall(r"producer|node|worker|operator", said))
        assert named == {role.value for role in stated}, cls.__name__
        needed = roles.PROOF_ROLE.get(cls)
        if needed is None:
            assert proof == "none", cls.__name__
        else:
            assert proof.startswith(needed.value), cls.__name__
    assert "backfilled" in rows[ScheduleFired.__name__][1]
