"""relay/prometheus/outboxkit-rules.yaml, the deployable alert rules, says what
docs/operations.md says: the same expressions and `for` durations, runbooks that name a section
of that page, and only metrics and labels the relay and the consumer export (plus the target
labels Prometheus adds, ``job`` and ``instance``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from outboxkit.inbox.metrics import InboxMetrics
from outboxkit.relay.metrics import RelayMetrics

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "relay" / "prometheus" / "outboxkit-rules.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
METRIC = re.compile(r"\boutboxkit_\w+")
GROUPED_BY = re.compile(r"\bby \(([^)]*)\)")


def _rules() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(RULES.read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def _flat(expr: str) -> str:
    return " ".join(expr.split())


def _documented() -> set[tuple[str, str | None]]:
    """(expression, for) of every PromQL block of "Alerts and what to do"; an expression
    continues on indented lines, a trailing ``# for: 5m`` is its duration."""
    text = OPERATIONS.read_text()
    section = text.split("## Alerts and what to do", 1)[1].split("\n## ", 1)[0]
    found: list[list[str | None]] = []
    for block in re.findall(r"```promql\n(.*?)```", section, re.S):
        for line in block.splitlines():
            code, _, comment = line.partition("#")
            duration = re.fullmatch(r"\s*for: (\S+)\s*", comment)
            if line[:1].isspace() and found:
                found[-1][0] = f"{found[-1][0]} {code}"
            elif code.strip():
                found.append([code, None])
            if duration:
                found[-1][1] = duration[1]
    return {(_flat(str(expr)), duration) for expr, duration in found}


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _exported() -> dict[str, set[str]]:
    """Every metric family the relay and the consumer export, with its label names."""
    families: dict[str, set[str]] = {}
    for holder in (RelayMetrics(), InboxMetrics()):
        for metric in vars(holder).values():
            names = getattr(metric, "_labelnames", None)  # prometheus_client's label names
            if names is not None:
                families[metric._name] = set(names)
    return families


def test_the_rules_are_the_documented_alerts() -> None:
    rules = [(_flat(rule["expr"]), rule.get("for")) for rule in _rules()]
    assert len(rules) == len(set(rules))
    assert set(rules) == _documented()


def _result_labels(expr: str) -> set[str]:
    """The labels an alert of ``expr`` carries: its first ``by (...)`` (the outermost
    aggregation here), without ``le`` under histogram_quantile; none for absent()."""
    if expr.startswith("absent("):
        return set()
    grouped = GROUPED_BY.search(expr)
    assert grouped is not None, expr
    return {g.strip() for g in grouped[1].split(",")} - {"le"}


def test_the_summaries_use_only_labels_the_alert_carries() -> None:
    for rule in _rules():
        used = set(re.findall(r"\$labels\.(\w+)", rule["annotations"]["summary"]))
        assert used <= _result_labels(rule["expr"]), rule


def test_every_rule_has_a_severity_a_summary_and_a_runbook_section() -> None:
    anchors = {
        _anchor(line.lstrip("#"))
        for line in OPERATIONS.read_text().splitlines()
        if line[:3] == "###"
    }
    names = [rule["alert"] for rule in _rules()]
    assert len(names) == len(set(names))
    for rule in _rules():
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule
        assert rule["annotations"]["summary"], rule
        page, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert page == "docs/operations.md", rule
        assert anchor in anchors, rule


def test_the_rules_use_only_exported_metrics_and_their_labels() -> None:
    exported = _exported()
    assert "outboxkit_relay_lease_lost" in exported  # the lookup itself works
    for rule in _rules():
        used = {re.sub(r"_(total|bucket|sum|count)$", "", m) for m in METRIC.findall(rule["expr"])}
        assert used <= set(exported), rule
        labels = set().union(*(exported[m] for m in used)) | {"le", "job", "instance"}
        for grouped in GROUPED_BY.findall(rule["expr"]):
            assert {g.strip() for g in grouped.split(",")} <= labels, rule
