"""The metric names evsched's API, nodes, workers and relays export, as scrapes show them."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from evsched.metrics import Metrics, RelayInstruments, WorkerInstruments, add_process_collectors
from evsched.runtime.node.metrics import NodeMetrics
from evsched.runtime.node.node import Node, NodeConfig
from evsched.settings import Settings

# The sample names Prometheus' text format gives each family type, beyond the family's name.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "unknown": ("",),
}
# Metric names in PromQL or prose: the families evsched and the standard collectors export.
METRIC_NAME = re.compile(r"\b(?:evsched|process|python)_[a-z0-9_]+\b")


def _names(family: Metric) -> set[str]:
    names = {family.name + suffix for suffix in SUFFIXES[family.type]}
    return names | {sample.name for sample in family.samples}


def _registries(data_dir: Path) -> list[CollectorRegistry]:
    api = Metrics()  # the API's, with the jobs-by-status gauge of its replica
    node = NodeMetrics.create()
    # A node registers what it reads at scrape time (its owned partitions) when it is made.
    Node(NodeConfig(settings=Settings(), node_id="n", data_dir=data_dir), node)
    worker = WorkerInstruments()
    worker.serving(["q"])
    relay = RelayInstruments()
    relay.failures.labels("broker")
    registries = [api.registry, node.folded.registry, worker.registry, relay.registry]
    for registry in registries[1:]:  # nodes, workers and relays serve the process collectors too
        add_process_collectors(registry)
    return registries


def exported_names(data_dir: Path) -> frozenset[str]:
    """Every sample name a scrape of the API, a node, a worker or a relay can show."""
    return frozenset(
        name
        for registry in _registries(data_dir)
        for family in registry.collect()
        for name in _names(family)
    )


def referenced_names(text: str) -> set[str]:
    """The evsched_, process_ and python_ metric names ``text`` mentions."""
    return set(METRIC_NAME.findall(text))
