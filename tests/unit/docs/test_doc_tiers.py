"""The cheap test tiers that CONTRIBUTING.md and the Makefile offer run alone and exit 0, each in
a pytest of its own; and a session's end survives what once broke ``pytest tests/contract``
after its tests had passed: a plugin's late ``ast.parse`` while the garbage collector runs a
finalizer that parses too (``tests/conftest.py``, ``pytest_sessionfinish``).

The tiers that need a broker or Chromium, and the whole unit tier (which holds this test), are
left to CI's own runs of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# Each tier as documented: its pytest arguments, and the document that offers it.
TIERS = {
    "contract-twins": (["tests/contract", "-m", "not broker"], "CONTRIBUTING.md"),
    "replay": (["tests/replay"], "Makefile"),
    "unit-core": (["tests/unit/core"], "CONTRIBUTING.md"),
}
CRASHES = ("SystemError", "INTERNALERROR", "Traceback")


def _pytest(args: list[str], cwd: Path, timeout_s: float) -> tuple[int, str]:
    """A child pytest's exit code and output; outside this session's workers and cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "pytest", *args, "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("tier", TIERS)
def test_a_tier_is_what_its_document_offers(tier: str) -> None:
    args, document = TIERS[tier]
    assert args[0] in (ROOT / document).read_text(encoding="utf-8")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("tier", TIERS)
def test_a_documented_tier_runs_alone_and_exits_0(tier: str) -> None:
    code, output = _pytest(TIERS[tier][0], ROOT, timeout_s=540)
    assert code == 0, output[-4_000:]
    assert " passed" in output and not any(c in output for c in CRASHES), output[-4_000:]


LATE_PLUGIN = """
    import ast, gc

    SOURCE = "\\n".join(f"def f{i}(a):\\n    return [a * {i} for _ in a]" for i in range(300))


    class LateImport:
        # schemathesis' plugin imports its report writers at session end: pytest rewrites them.
        def pytest_sessionfinish(self):
            gc.enable()
            gc.set_threshold(1)  # a collection during the parse, as a large module's makes
            try:
                ast.parse(SOURCE)
            finally:
                gc.set_threshold(700, 10, 10)


    def pytest_configure(config):
        config.pluginmanager.register(LateImport(), "late-import")
"""
LEAK = """
    import ast, gc


    class Parses:
        # asyncio logs a future's exception nobody retrieved, formatting it with ast.parse.
        def __del__(self):
            ast.parse("x = (1 +\\n 2)")


    def test_leaves_a_cycle_for_the_collector():
        gc.disable()  # until the session's end
        leak = Parses()
        leak.cycle = leak
"""


@pytest.mark.timeout(300)
def test_a_finalizer_that_parses_does_not_break_a_late_parse_at_session_end(
    tmp_path: Path,
) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(LATE_PLUGIN))
    (tmp_path / "test_leak.py").write_text(textwrap.dedent(LEAK))
    code, output = _pytest([], tmp_path, timeout_s=240)
    if "AST constructor recursion depth mismatch" not in output:
        pytest.skip(f"this Python's AST constructor is re-entrant (exit {code})")
    code, output = _pytest(["-p", "tests.conftest"], tmp_path, timeout_s=240)
    assert code == 0 and not any(c in output for c in CRASHES), output[-4_000:]
