"""Finds and reads the contract files (Avro schemas of events and projections) shipped with evsched.

A wheel carries them as ``evsched/_contract/{schemas,projections}``; an editable install or a source
checkout has no such folder, so the repository's top-level folders are the fallback.
"""

from __future__ import annotations

import json
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal

from evsched.errors import ContractError

ContractFolder = Literal["schemas", "projections"]

# src/evsched/adapters/contract.py -> the checkout's root, which holds schemas/ and projections/.
_SOURCE_ROOT = Path(__file__).resolve().parents[3]


def contract_dir(folder: ContractFolder) -> Traversable:
    """The folder holding the contract files: packaged in the wheel, or the source tree's."""
    packaged = resources.files("evsched") / "_contract" / folder
    if packaged.is_dir():
        return packaged
    source = _SOURCE_ROOT / folder
    # The pyproject check keeps an installed copy from picking up an unrelated folder by accident.
    if (_SOURCE_ROOT / "pyproject.toml").is_file() and source.is_dir():
        return source
    raise ContractError(f"contract folder {folder!r} is neither packaged nor at {source}")


def load_schema_files(folder: ContractFolder, subfolder: str = "") -> dict[str, Any]:
    """Every ``*.avsc`` file of one folder (not recursive), as JSON keyed by its path in the folder.

    Sorted by path, so whatever is derived from the result does not depend on directory order.
    """
    base = contract_dir(folder)
    where = base / subfolder if subfolder else base
    if not where.is_dir():
        return {}
    prefix = f"{subfolder}/" if subfolder else ""
    files = sorted(
        (entry for entry in where.iterdir() if entry.name.endswith(".avsc") and entry.is_file()),
        key=lambda entry: entry.name,
    )
    loaded: dict[str, Any] = {}
    for entry in files:
        path = prefix + entry.name
        try:
            loaded[path] = json.loads(entry.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ContractError(f"{folder}/{path}: {exc}") from exc
    return loaded
