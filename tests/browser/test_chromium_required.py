"""Without Chromium the browser tests skip on a laptop and fail under CI=true."""

from __future__ import annotations

import pytest

from tests.browser import conftest


def test_a_missing_chromium_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest.shutil, "which", lambda _: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        conftest.chromium_path()
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception):
        conftest.chromium_path()
