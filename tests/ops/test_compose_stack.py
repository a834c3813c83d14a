"""compose.yaml exercised, not only parsed: its services started from their own commands and
environment (tests/ops/compose_local.py), scaled, serving requests, passing their health checks,
logging one structured line per event."""

from __future__ import annotations

import os
import re
import time

import httpx
import redis

from tests.ops.compose_local import LIGHTSTREAM, LocalCompose

LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<service>tokenizer|router|worker|detokenizer)/(?P<replica>\S+) rid=(?P<rid>\S+) [\w.]+: "
)


def test_every_front_end_serves(compose_stack: LocalCompose) -> None:
    body = {"inputs": "What is AI?", "parameters": {"max_new_tokens": 12, "ignore_eos": True}}
    assert len(compose_stack.urls) == 2
    for url in compose_stack.urls:  # each reads the replies on its own stream, named after its replica
        r = httpx.post(url + "/generate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["finish_reason"] == "length" and out["count_output_tokens"] == 12


def test_the_model_service_made_the_demo_model(compose_stack: LocalCompose) -> None:
    made = os.listdir(compose_stack.volumes["models"])
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(made), made


def test_scaled_workers_form_their_own_groups_and_detokenizers_their_own_shards(compose_stack: LocalCompose) -> None:
    # a replica that has just turned healthy reaches the front end's view with its next
    # liveness refresh (every second), so give the view a few of them
    end = time.monotonic() + 5.0
    while True:
        health = httpx.get(compose_stack.url + "/health", timeout=10).json()
        if (len(health["workers"]), len(health["detokenizers"])) == (2, 2) or time.monotonic() > end:
            break
        time.sleep(0.2)
    assert len(health["workers"]) == 2 and len(health["detokenizers"]) == 2, health
    # LS_GROUP=auto: each group is named after its replica (host name and pid; pid 1 in a container)
    pids = {str(p.proc.pid) for p in compose_stack.replicas("worker") if p.proc is not None}
    assert {g.rsplit("-", 1)[1] for g in health["workers"]} == pids


def test_redis_is_append_only_and_bounded(compose_stack: LocalCompose) -> None:
    client = redis.Redis.from_url(compose_stack.redis_url)
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    assert client.config_get("maxmemory") == {"maxmemory": str(1 << 30)}
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}


def test_every_health_check_passes(compose_stack: LocalCompose) -> None:
    for service in LIGHTSTREAM:
        test = compose_stack.service(service)["healthcheck"]["test"]
        for replica in compose_stack.replicas(service):
            assert replica.healthcheck(test), f"{replica.name}: {test}"


def test_every_log_line_is_one_structured_event(compose_stack: LocalCompose) -> None:
    httpx.post(compose_stack.url + "/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 4}})
    rids = set()
    for service in LIGHTSTREAM:
        for replica in compose_stack.replicas(service):
            lines = replica.output().splitlines()
            assert lines, f"{replica.name} logged nothing"
            for line in lines:
                m = LINE.match(line)
                assert m, f"{replica.name}: not a structured line: {line!r}"
                assert m["service"] == service
                if m["rid"] != "-":
                    rids.add(m["rid"])
    assert any(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in rids), "no line names a request"
