"""``evsched rebuild --verify`` on the real broker (issue 9, B.6): it names, per partition, the
offsets it compared, and comparing nothing fails: a live index at offset -1, or one further behind
the log end than ``--max-behind``, fails naming the partition."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import typer
from tests.conftest import TEST_EVENT_PARTITIONS
from typer.testing import CliRunner

from evsched.client import App
from evsched.operator import register
from evsched.operator.commands.rebuild import _log_ends
from evsched.operator.rebuild import PartitionPlan, rebuild_one
from evsched.settings import Settings

pytestmark = [pytest.mark.broker]


def run_cli(env: dict[str, str], *args: str) -> tuple[int, Any]:
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, [*args, "--json"], env=env)
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else result.output


async def test_verify_fails_naming_partitions_it_could_not_compare(
    kafka_bootstrap: str, namespace: str, tmp_path: Path
) -> None:
    settings = Settings(
        bootstrap=kafka_bootstrap, namespace=namespace, event_partitions=TEST_EVENT_PARTITIONS
    )
    app = App(settings, name="verify")

    @app.task(name="t.verify")
    def verify_me(i: int) -> None: ...

    async with app:
        for i in range(30):
            await verify_me.enqueue(i)
    ends = await _log_ends(settings)
    assert all(end >= 3 for end in ends.values()), ends

    # A "live" index per partition: p0 never folded anything, p1 stops 2 records short, p2 is
    # caught up. Each is what a node would have, made by folding the same log.
    live = tmp_path / "live"
    untils = {0: -1, 1: ends[1] - 3, 2: ends[2] - 1}
    for partition, until in untils.items():
        plan = PartitionPlan(
            bootstrap=kafka_bootstrap,
            namespace=namespace,
            partition=partition,
            until=until,
            directory=live / f"p{partition:04d}",
        )
        await asyncio.to_thread(rebuild_one, plan)

    env = {"EVSCHED_KAFKA_BOOTSTRAP": kafka_bootstrap, "EVSCHED_NAMESPACE": namespace}
    common = ["rebuild", "--verify", "--live-dir", str(live), "--processes", "1"]
    code, strict = await asyncio.to_thread(
        run_cli, env, *common, "--data-dir", str(tmp_path / "a"), "--max-behind", "1"
    )
    assert code == 1, strict
    assert strict["digest_match"] is False
    by_partition = {p["partition"]: p for p in strict["partitions"]}
    assert "offset -1" in by_partition[0]["problem"]
    assert "2 records behind" in by_partition[1]["problem"]
    assert by_partition[2]["problem"] is None
    for partition, until in untils.items():
        row = by_partition[partition]
        assert (row["log_end"], row["live_applied_offset"]) == (ends[partition], until)
        assert row["applied_offset"] == until

    code, lenient = await asyncio.to_thread(
        run_cli, env, *common, "--data-dir", str(tmp_path / "b"), "--max-behind", "10"
    )
    assert code == 1, lenient
    problems = {p["partition"]: p["problem"] for p in lenient["partitions"]}
    assert problems[1] is None and problems[2] is None
    assert "offset -1" in problems[0]

    # Without the partition that compared nothing, the rest verifies.
    for entry in (live / "p0000").iterdir():
        entry.unlink()
    (live / "p0000").rmdir()
    result = await asyncio.to_thread(
        CliRunner().invoke,
        _cli(),
        [*common, "--data-dir", str(tmp_path / "c"), "--max-behind", "10"],
        env={**env, "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].startswith("digest_match=true")


def _cli() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app
