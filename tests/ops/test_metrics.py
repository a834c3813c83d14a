"""Every service's Prometheus series, scraped from the compose stack: each series that
docs/metrics.md documents is served by its service, and each served series is documented.
The Grafana dashboard asks only for documented series."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.ops.compose_local import ROOT, LocalCompose

DOCS = os.path.join(ROOT, "docs", "metrics.md")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "lightstream.json")
SECTIONS = {"front end": "tokenizer", "router": "router", "worker": "worker", "detokenizer": "detokenizer"}


@dataclass(frozen=True)
class Documented:
    name: str  # as exposed: counters with _total, histograms by their base name
    kind: str
    labels: tuple[str, ...]

    @property
    def family(self) -> str:
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


def documented() -> dict[str, list[Documented]]:
    """service -> the series docs/metrics.md lists in its section."""
    out: dict[str, list[Documented]] = {}
    service = None
    with open(DOCS) as f:
        for line in f:
            if line.startswith("## "):
                service = SECTIONS.get(line[3:].strip())
                continue
            m = re.match(r"\| `(lightstream_\w+)` \| (\w+) \|\s*([\w, ]*?)\s*\|", line)
            if m and service:
                labels = tuple(x.strip() for x in m[3].split(",") if x.strip())
                out.setdefault(service, []).append(Documented(m[1], m[2], labels))
    return out


def scrape(url: str) -> dict[str, list[dict[str, str]]]:
    """family name -> the label sets of its samples (an empty list: declared, no sample yet)."""
    r = httpx.get(url, timeout=10)
    assert r.status_code == 200, r.text
    return {
        fam.name: [dict(s.labels) for s in fam.samples]
        for fam in text_string_to_metric_families(r.text)
        # prometheus_client's creation times of counters and histograms (the front end's) are not series of ours
        if fam.name.startswith("lightstream_") and not fam.name.endswith("_created")
    }


def endpoints(stack: LocalCompose, service: str) -> list[str]:
    if service == "tokenizer":
        return [stack.url + "/metrics"]
    return [f"http://127.0.0.1:{p.env['LS_METRICS_PORT']}/metrics" for p in stack.replicas(service)]


@pytest.fixture(scope="module")
def scrapes(compose_stack: LocalCompose) -> dict[str, list[dict[str, list[dict[str, str]]]]]:
    """service -> one scrape per replica, taken after some traffic."""
    bodies = [
        {"inputs": "What is AI?", "parameters": {"max_new_tokens": 8}},
        {"inputs": "Tell me", "parameters": {"max_new_tokens": 16, "stop_sequences": [" "]}},
        {"inputs": "x", "parameters": {"max_new_tokens": 0}},  # a 4xx: an error series
    ]
    for body in bodies:
        httpx.post(compose_stack.url + "/generate", json=body, timeout=60)
    return {service: [scrape(url) for url in endpoints(compose_stack, service)] for service in SECTIONS.values()}


@pytest.mark.parametrize("service", list(SECTIONS.values()))
def test_every_documented_series_is_served(service: str, scrapes: dict) -> None:
    docs = documented()[service]
    assert docs, f"docs/metrics.md documents nothing for {service}"
    for replica in scrapes[service]:
        for d in docs:
            assert d.family in replica, f"{service} does not serve {d.name}"
            for labels in replica[d.family]:
                missing = set(d.labels) - set(labels)
                assert not missing, f"{d.name} lacks the documented labels {missing}: {labels}"


@pytest.mark.parametrize("service", list(SECTIONS.values()))
def test_every_served_series_is_documented(service: str, scrapes: dict) -> None:
    families = {d.family for d in documented()[service]}
    for replica in scrapes[service]:
        assert set(replica) <= families, f"undocumented {service} series: {set(replica) - families}"


def test_every_replica_serves_its_own(scrapes: dict) -> None:
    groups = {s["group"] for r in scrapes["worker"] for s in r["lightstream_worker_kv_usage"]}
    shards = {s["shard"] for r in scrapes["detokenizer"] for s in r["lightstream_detokenizer_sessions"]}
    assert len(groups) == 2 and len(shards) == 2, (groups, shards)


def test_the_figures_count_the_traffic(compose_stack: LocalCompose) -> None:
    def total(service: str, sample: str) -> float:
        out = 0.0
        for url in endpoints(compose_stack, service):
            for fam in text_string_to_metric_families(httpx.get(url, timeout=10).text):
                out += sum(s.value for s in fam.samples if s.name == sample)
        return out

    before = total("worker", "lightstream_worker_decode_tokens_total")
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 10, "ignore_eos": True}}
    assert httpx.post(compose_stack.url + "/generate", json=body, timeout=60).status_code == 200
    assert total("worker", "lightstream_worker_decode_tokens_total") >= before + 9  # the first token is the prefill's
    assert total("worker", "lightstream_worker_steps_total") > 0
    assert total("worker", "lightstream_worker_step_seconds_count") > 0
    assert total("detokenizer", "lightstream_detokenizer_token_items_total") >= 10
    assert total("router", "lightstream_router_worker_groups") == 2


def test_the_dashboard_asks_only_for_documented_series() -> None:
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    known = {d.family for docs in documented().values() for d in docs}
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    for expr in exprs:
        for name in re.findall(r"lightstream_\w+", expr):
            base = re.sub(r"_(bucket|sum|count|total)$", "", name)
            assert base in known, f"the dashboard asks for {name}, which docs/metrics.md does not document"
    sections = {p["title"] for p in dashboard["panels"] if p["type"] == "row"}
    assert len(sections) == 4, sections  # one row per service
