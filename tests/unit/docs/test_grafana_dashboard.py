"""The shipped Grafana dashboard: well formed, showing what issue 14 asks, over exported metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.exported_metrics import exported_names, referenced_names
from tests.promtool import promtool

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "evsched.json"
# What Grafana puts in place of its variables before Prometheus sees a query.
VARIABLES = {"$__rate_interval": "5m", "$queue": ".*", "$job": ".*"}
GRID_COLUMNS = 24


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def _queries(dashboard: dict[str, Any]) -> Iterator[str]:
    """Every PromQL expression: the panels' targets and the variables' queries."""
    for panel in _panels(dashboard):
        for target in panel["targets"]:
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["definition"]


def _promql(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def test_the_dashboard_is_importable(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "evsched"
    assert dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in _panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= GRID_COLUMNS, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert panel["description"], panel["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"


def test_the_dashboard_shows_what_operators_look_at(dashboard: dict[str, Any]) -> None:
    titles = {panel["title"] for panel in _panels(dashboard)}
    assert {
        "Throughput",
        "Queue depth",
        "Status distribution",
        "Start lateness",
        "Processing time",
        "Retries and dead letters",
        "Stale completions",
        "Consumer lag",
        "Owner per partition",
        "Workers per queue",
    } <= titles


def test_every_query_names_only_metrics_the_code_exports(
    dashboard: dict[str, Any], tmp_path: Path
) -> None:
    exported = exported_names(tmp_path)
    for expr in _queries(dashboard):
        named = referenced_names(expr)
        assert named, f"no metric found in {expr!r}"
        assert named - exported == set(), expr


def test_promtool_parses_every_query(dashboard: dict[str, Any], tmp_path: Path) -> None:
    """Each expression as a recording rule: promtool's own PromQL parser reads them all."""
    exprs = [_promql(expr) for expr in _queries(dashboard) if not expr.startswith("label_values")]
    rules = [{"record": f"evsched:dashboard_query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = promtool("check", "rules", path.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout
