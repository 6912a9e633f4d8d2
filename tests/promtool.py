"""promtool in tests: from Debian's `prometheus` package, which CI installs, so there it must be."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PROMTOOL_TIMEOUT_S = 60


def promtool_path() -> str:
    """promtool's path; skips the test without it, or fails it under ``CI=true``."""
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail("promtool is missing: `apt-get install prometheus` (.ci/run does)")
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return path


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool_path(), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_S,
        check=False,
    )
