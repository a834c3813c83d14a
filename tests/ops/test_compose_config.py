"""compose.yaml and compose.gpu.yaml as Docker Compose reads them (`docker-compose config`,
Debian's docker-compose 1.29, installed by tools/setup.sh), and the Dockerfile they build from."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests.ops.compose_local import DOCKERFILE, LIGHTSTREAM, ROOT

pytestmark = pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed")


def compose_config(*files: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    argv = ["docker-compose", "--project-directory", ROOT]
    for f in files:
        argv += ["-f", os.path.join(ROOT, f)]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LS_") and k != "MODEL_DIR"}
    return subprocess.run([*argv, "config"], env={**clean, **(env or {})}, capture_output=True, text=True)


def resolved(*files: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    r = compose_config(*files, env=env)
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)


def _published(port: str | dict[str, Any]) -> tuple[str, int]:
    """(host address, container port) of a published port, as either compose renders it."""
    if isinstance(port, dict):
        return port.get("host_ip", ""), int(port["target"])
    host_ip, _host, container = port.rsplit(":", 2)
    return host_ip, int(container.split("/")[0])


def test_compose_yaml_is_valid_and_complete() -> None:
    services = resolved("compose.yaml")["services"]
    assert {"redis", "model", *LIGHTSTREAM, "visual", "prometheus", "grafana"} == set(services)
    for name in ("redis", *LIGHTSTREAM):
        s = services[name]
        assert s["restart"] == "unless-stopped", name
        assert s["healthcheck"]["test"][0] == "CMD", name
        assert s["logging"]["options"]["max-size"], name  # logs are capped
    assert services["redis"]["command"][1:3] == ["--appendonly", "yes"]
    assert services["model"]["restart"] == "no"
    for name in LIGHTSTREAM:
        s = services[name]
        assert s["environment"]["LS_REDIS_URL"] == "redis://:@redis:6379/0", name  # no password: none given
        assert s["depends_on"]["redis"]["condition"] == "service_healthy", name
        assert s["depends_on"]["model"]["condition"] == "service_completed_successfully", name
        assert "models:/model:ro" in s["volumes"], name
        if name != "tokenizer":
            assert s["environment"]["LS_METRICS_PORT"] == "9100", name
    assert [_published(p) for p in services["tokenizer"]["ports"]] == [("127.0.0.1", 8000)]
    for name, port in (("prometheus", 9090), ("grafana", 3000)):  # this host only, unless LS_BIND says otherwise
        assert [_published(p) for p in services[name]["ports"]] == [("127.0.0.1", port)], name
    exposed = resolved("compose.yaml", env={"LS_BIND": "0.0.0.0"})["services"]["tokenizer"]["ports"]
    assert [_published(p) for p in exposed] == [("0.0.0.0", 8000)]
    worker = services["worker"]
    assert worker["environment"]["LS_GROUP"] == "auto" and worker["environment"]["LS_DEVICE"] == "cpu"
    assert worker["build"]["target"] == "cpu" and services["tokenizer"]["build"]["target"] == "light"
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]
    grafana = services["grafana"]["environment"]  # an anonymous visitor only views
    assert grafana["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer" and "GF_AUTH_DISABLE_LOGIN_FORM" not in grafana
    visual = services["visual"]  # a vision model's: started with --profile vision
    assert visual["profiles"] == ["vision"] and visual["command"] == ["python", "-m", "services.visual"]
    assert visual["environment"]["LS_MODEL_DIR"] == "/model" and visual["build"]["target"] == "cpu"


def test_a_redis_password_is_asked_for_and_given_by_every_service() -> None:
    services = resolved("compose.yaml", env={"LS_REDIS_PASSWORD": "s3cret"})["services"]
    command = services["redis"]["command"]
    assert command[command.index("--requirepass") + 1] == "s3cret"
    assert services["redis"]["environment"]["REDISCLI_AUTH"] == "s3cret"  # its health check's
    # a plain redis-cli ping exits 0 on a NOAUTH reply too: -e makes an error reply fail the check
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "-e", "ping"]
    for name in LIGHTSTREAM:
        assert services[name]["environment"]["LS_REDIS_URL"] == "redis://:s3cret@redis:6379/0", name
    command = resolved("compose.yaml")["services"]["redis"]["command"]
    assert command[command.index("--requirepass") + 1] == ""  # none: Redis asks for nothing


def test_the_gpu_override_reserves_gpus_and_mounts_the_model_read_only(tmp_path) -> None:
    services = resolved("compose.yaml", "compose.gpu.yaml", env={"MODEL_DIR": str(tmp_path), "LS_GPUS": "2"})[
        "services"
    ]
    worker = services["worker"]
    assert worker["build"]["target"] == "cuda" and worker["environment"]["LS_DEVICE"] == "cuda"
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and str(device["count"]) == "2"
    assert worker["shm_size"] and worker["ulimits"]["memlock"] == -1
    for name in ("model", "tokenizer", "worker", "detokenizer"):
        assert f"{tmp_path}:/model:ro" in services[name]["volumes"], name
        assert not any(v.startswith("models:") for v in services[name]["volumes"]), name
    assert worker["environment"]["LS_GROUP"] == "auto"  # the base file's settings stay


def test_the_gpu_override_asks_for_model_dir() -> None:
    r = compose_config("compose.yaml", "compose.gpu.yaml")
    assert r.returncode != 0 and "MODEL_DIR" in r.stderr


def test_the_dockerfile_has_every_target_compose_builds() -> None:
    with open(DOCKERFILE) as f:
        text = f.read()
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", text, flags=re.M))
    targets = {
        s["build"]["target"]
        for s in resolved("compose.yaml", "compose.gpu.yaml", env={"MODEL_DIR": "/m"})["services"].values()
        if "build" in s
    }
    targets |= {s["build"]["target"] for s in resolved("compose.yaml")["services"].values() if "build" in s}
    assert targets == {"light", "cpu", "cuda"} and targets <= stages, (targets, stages)
    for source in re.findall(r"^COPY (\S+) ", text, flags=re.M):
        assert os.path.exists(os.path.join(ROOT, source)), source
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        kept = {line[1:].strip() for line in f if line.startswith("!")}
    assert set(re.findall(r"^COPY (\S+) ", text, flags=re.M)) <= kept, "a COPY source is left out of the context"


def test_the_monitoring_files_match_the_stack() -> None:
    """Prometheus scrapes each service on the port compose.yaml gives it, and Grafana's
    provisioned datasource is what the dashboard's datasource variable offers (the only
    Prometheus source, and the default), the variable every panel reads."""
    services = resolved("compose.yaml")["services"]
    with open(os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")) as f:
        jobs = {j["job_name"]: j["dns_sd_configs"][0] for j in yaml.safe_load(f)["scrape_configs"]}
    assert set(jobs) == {*LIGHTSTREAM, "visual"}
    for name, sd in jobs.items():
        env = services[name]["environment"]
        assert sd["names"] == [name] and str(sd["port"]) == env.get("LS_METRICS_PORT", env.get("LS_PORT")), name
    with open(os.path.join(ROOT, "deploy", "grafana", "provisioning", "datasources", "prometheus.yml")) as f:
        (source,) = yaml.safe_load(f)["datasources"]
    with open(os.path.join(ROOT, "deploy", "grafana", "lightstream.json")) as f:
        dashboard = json.load(f)
    panels = dashboard["panels"]
    assert {p["datasource"]["uid"] for p in panels if p.get("datasource")} == {"${datasource}"}
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == source["type"]
    assert source["type"] == "prometheus" and source.get("isDefault") is True
    assert "model_name" in variables["model"]["query"]["query"]
    for volume in services["grafana"]["volumes"] + services["prometheus"]["volumes"]:
        assert os.path.exists(volume.split(":")[0]), volume
