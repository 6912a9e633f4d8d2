"""The shipped alert rules: promtool accepts them and their unit tests pass; each is documented."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.exported_metrics import exported_names, referenced_names
from tests.promtool import promtool

PROMETHEUS_DIR = Path(__file__).resolve().parents[3] / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "alerts.yml"
RULE_TESTS = PROMETHEUS_DIR / "alerts_test.yml"


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_accepts_the_rules() -> None:
    done = promtool("check", "rules", RULES.name, cwd=PROMETHEUS_DIR)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout


def test_the_rules_pass_their_promtool_unit_tests() -> None:
    done = promtool("test", "rules", RULE_TESTS.name, cwd=PROMETHEUS_DIR)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_rule_waits_is_graded_and_says_what_to_run() -> None:
    rules = _rules()
    assert len(rules) >= 10
    for rule in rules:
        name = rule["alert"]
        assert name.startswith("Evsched"), name
        assert rule.get("for"), f"{name}: a `for:` tells a blip from a lasting condition"
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        annotations = rule["annotations"]
        assert annotations["summary"].strip(), name
        # Runbook-like: the description names where to look deeper.
        assert (
            "`evsched " in annotations["description"] or "/readyz" in annotations["description"]
        ), name


def test_every_rule_has_a_case_that_must_not_fire_and_one_that_must() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    silent: set[str] = set()
    firing: set[str] = set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else silent).add(check["alertname"])
    names = {rule["alert"] for rule in _rules()}
    assert names - silent == set(), "rules without a blip that must not fire"
    assert names - firing == set(), "rules without a lasting condition that must fire"


def test_the_rules_name_only_metrics_the_code_exports(tmp_path: Path) -> None:
    referenced = referenced_names(RULES.read_text(encoding="utf-8"))
    assert "evsched_dead_letters_total" in referenced  # the scan finds names at all
    assert referenced - exported_names(tmp_path) == set()
