"""Which transactions a node uses: one per node tick unless EVSCHED_NODE_TRANSACTIONS=partition."""

from __future__ import annotations

from pathlib import Path

import pytest

from evsched.runtime.node.node import TRANSACTIONS_ENV, NodeConfig, tick_transactions_from_env
from evsched.settings import Settings, SettingsError


@pytest.mark.parametrize(
    ("value", "tick"), [(None, True), ("", True), ("tick", True), (" partition ", False)]
)
def test_tick_transactions_are_the_default_and_partition_opts_out(
    value: str | None, tick: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if value is None:
        monkeypatch.delenv(TRANSACTIONS_ENV, raising=False)
    else:
        monkeypatch.setenv(TRANSACTIONS_ENV, value)
    assert tick_transactions_from_env() is tick
    config = NodeConfig(settings=Settings(namespace="ns"), node_id="n", data_dir=tmp_path)
    assert config.tick_transactions is tick


def test_another_mode_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRANSACTIONS_ENV, "Tick")
    with pytest.raises(SettingsError, match="EVSCHED_NODE_TRANSACTIONS='Tick': expected one of"):
        tick_transactions_from_env()
