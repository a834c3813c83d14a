"""deploy/kubernetes rendered offline (`kubectl kustomize`, every overlay) and checked against
the Kubernetes schemas (kubernetes-validate) and against the code: every image is a Dockerfile
target that has what its command needs, every command a service's module, every LS_* variable
a flag of that service's config (and valid there), every probe a route or port that exists;
the grace periods cover the drain; PDBs, the HPA and KEDA's ScaledObject aim at what exists;
Redis asks for the password of one Secret, which every service and KEDA give."""

from __future__ import annotations

import dataclasses
import os
import urllib.parse

import pytest

from services.tokenizer.drain import CLOSE_S, FLUSH_S
from services.tokenizer.gates import PROBES
from services.tokenizer.ops_routes import ops_router
from shared.cli import parse_config
from shared.config import CommonConfig, DetokenizerConfig, RouterConfig, TokenizerConfig, WorkerConfig
from shared.streams import GROUP_ROUTER, StreamNames
from shared.visual_config import VisualConfig
from tests.ops.kube_render import (
    OVERLAYS,
    ROOT,
    Rendered,
    container_argv,
    container_env,
    dockerfile_copies,
    dockerfile_targets,
    kubectl,
    pod_spec,
    render,
    secret_stand_in,
)

pytestmark = pytest.mark.skipif(kubectl() is None, reason="kubectl is not installed")

CONFIGS = {
    "services.tokenizer": TokenizerConfig,
    "services.router": RouterConfig,
    "services.worker": WorkerConfig,
    "services.detokenizer": DetokenizerConfig,
    "services.visual": VisualConfig,
}
TORCH_IMAGES = {"cpu", "cuda"}  # the light image has no torch
REDIS_PASSWORD = secret_stand_in("lightstream-redis", "password")


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> Rendered:
    return render(request.param)


def test_overlays_are_the_documented_ones() -> None:
    assert set(OVERLAYS) == {"cpu-demo", "gpu", "gpu-sentinel", "gpu-vision"}


def test_objects_validate_against_the_kubernetes_schemas(rendered: Rendered) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for obj in rendered.objects:
        if obj["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: test_keda_scales_the_workers_on_the_router_queue checks its fields
        kubernetes_validate.validate(obj, "1.32.0", strict=True)


def _containers(rendered: Rendered):
    for w in rendered.workloads():
        spec = pod_spec(w)
        for c in spec.get("initContainers", []) + spec["containers"]:
            yield w, c


def test_images_commands_and_environment_match_the_code(rendered: Rendered) -> None:
    targets = dockerfile_targets()
    copied = dockerfile_copies()
    for w, c in _containers(rendered):
        where = f"{rendered.overlay} {w['metadata']['name']}/{c['name']}"
        repo, _, tag = c["image"].partition(":")
        if repo != "lightstream":
            continue  # redis
        assert tag in targets, where
        argv = c["command"] + c.get("args", [])
        assert argv[0] == "python", where
        if argv[1] == "-m":
            module = argv[2]
            assert os.path.exists(os.path.join(ROOT, *module.split("."), "__main__.py")), where
            if module in ("services.worker", "services.visual"):
                assert tag in TORCH_IMAGES, where
            env = container_env(rendered, c)
            _check_env(CONFIGS[module], env, argv[3:], where)
        else:  # a script of the repository, in the image
            script = argv[1]
            assert os.path.exists(os.path.join(ROOT, script)) and script.split("/")[0] in copied, where
            assert tag in TORCH_IMAGES, where  # the demo model is made with torch


def _check_env(cls: type, env: dict[str, str], argv: list[str], where: str) -> None:
    known = {"LS_" + f.name.upper() for f in dataclasses.fields(cls)}
    ours = {k: v for k, v in env.items() if k.startswith("LS_")}
    assert set(ours) <= known, f"{where}: not flags of {cls.__name__}: {sorted(set(ours) - known)}"
    cfg = parse_config(cls, argv, ours)  # every value valid where the service reads it
    assert cfg.replica == "pod-name-0", f"{where}: LS_REPLICA is the pod's name"


def test_the_configmap_holds_common_flags_and_what_env_composes(rendered: Rendered) -> None:
    common = {"LS_" + f.name.upper() for f in dataclasses.fields(CommonConfig)}
    flags = {k for k in rendered.config_env() if k.startswith("LS_")}
    assert flags <= common
    values = " ".join(str(e.get("value", "")) for _, c in _containers(rendered) for e in c.get("env", []))
    for other in set(rendered.config_env()) - flags:  # a part of a value put together in env
        assert f"$({other})" in values, other


def test_every_container_has_requests_and_limits(rendered: Rendered) -> None:
    for w, c in _containers(rendered):
        res = c["resources"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(res[kind]), f"{w['metadata']['name']}/{c['name']} {kind}"


def _container(rendered: Rendered, component: str) -> tuple[dict, dict]:
    w = rendered.component(component)
    return w, pod_spec(w)["containers"][0]


def _port(container: dict, name_or_number: str | int) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert name_or_number in ports, f"{container['name']}: no port {name_or_number}"
    return ports[name_or_number]


def test_front_end_probes_its_own_routes_and_drains_within_the_grace(rendered: Rendered) -> None:
    w, c = _container(rendered, "tokenizer")
    env = container_env(rendered, c)
    ready, live = c["readinessProbe"]["httpGet"], c["livenessProbe"]["httpGet"]
    assert (ready["path"], live["path"]) == ("/readiness", "/liveness")
    assert c["startupProbe"]["httpGet"]["path"] == "/liveness"
    routes = {r.path for r in ops_router(None, None).routes}  # type: ignore[arg-type]
    for probe in (ready, live):
        assert probe["path"] in routes and probe["path"] in PROBES  # served, and without a key
        assert _port(c, probe["port"]) == int(env["LS_PORT"])
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    needed = float(pre_stop[1]) + float(env["LS_DRAIN_TIMEOUT_S"]) + FLUSH_S + CLOSE_S
    assert pod_spec(w)["terminationGracePeriodSeconds"] >= needed
    service = rendered.get("Service", "lightstream")
    assert service["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
    assert _port(c, service["spec"]["ports"][0]["targetPort"]) == int(env["LS_PORT"])


def test_worker_groups_and_detokenizers_drain_within_the_grace(rendered: Rendered) -> None:
    # a worker group also stops its ranks after the drain (up to 10 s); each has a margin
    for name, after_s in (("worker", 10.0), ("detokenizer", 0.0)):
        w, c = _container(rendered, name)
        drain_s = float(container_env(rendered, c)["LS_DRAIN_TIMEOUT_S"])
        assert pod_spec(w)["terminationGracePeriodSeconds"] >= drain_s + after_s + 5, name


def _services(rendered: Rendered) -> set[str]:
    return {w["metadata"]["labels"]["app.kubernetes.io/component"] for w in rendered.workloads()}


def test_other_services_probe_their_metrics_port(rendered: Rendered) -> None:
    for name in {"router", "worker", "detokenizer", "visual"} & _services(rendered):
        _, c = _container(rendered, name)
        port = int(container_env(rendered, c)["LS_METRICS_PORT"])
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = c[probe]["httpGet"]
            assert get["path"] == "/metrics" and _port(c, get["port"]) == port, (name, probe)


def test_router_is_single_and_the_workers_are_groups_by_ordinal(rendered: Rendered) -> None:
    router = rendered.component("router")
    assert router["kind"] == "Deployment" and router["spec"]["replicas"] == 1
    assert router["spec"]["strategy"]["type"] == "Recreate"  # never two routers at once
    worker, c = _container(rendered, "worker")
    assert worker["kind"] == "StatefulSet"
    assert rendered.get("Service", worker["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
    env = {e["name"]: e for e in c["env"]}
    assert env["LS_GROUP"]["value"] == "auto"  # the group is the replica: the pod's name
    assert env["LS_REPLICA"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    tp = int(container_env(rendered, c)["LS_TP"])
    if container_env(rendered, c)["LS_DEVICE"] == "cuda":
        assert c["image"] == "lightstream:cuda"
        for kind in ("requests", "limits"):
            assert int(c["resources"][kind]["nvidia.com/gpu"]) == tp  # one GPU per rank, in the pod
    else:
        assert c["image"] == "lightstream:cpu" and "nvidia.com/gpu" not in c["resources"]["limits"]


def test_pdbs_cover_every_service_but_the_router(rendered: Rendered) -> None:
    covered = set()
    for pdb in rendered.of_kind("PodDisruptionBudget"):
        selector = pdb["spec"]["selector"]["matchLabels"].items()
        matched = [w for w in rendered.workloads() if selector <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matched) == 1, pdb["metadata"]["name"]
        covered.add(matched[0]["metadata"]["labels"]["app.kubernetes.io/component"])
    assert covered == {"tokenizer", "worker", "detokenizer", "visual"} & _services(rendered)


def test_hpa_scales_the_front_end_by_cpu(rendered: Rendered) -> None:
    (hpa,) = rendered.of_kind("HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    front, c = _container(rendered, "tokenizer")
    assert (ref["kind"], ref["name"]) == (front["kind"], front["metadata"]["name"])
    assert "replicas" not in front["spec"]  # the HPA's to set
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu" and c["resources"]["requests"]["cpu"]
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_keda_scales_the_workers_on_the_router_queue(rendered: Rendered) -> None:
    objects = rendered.of_kind("ScaledObject")
    if rendered.overlay == "cpu-demo":
        assert not objects
        return
    (so,) = objects
    ref = so["spec"]["scaleTargetRef"]
    worker = rendered.component("worker")
    assert (ref["kind"], ref["name"]) == (worker["kind"], worker["metadata"]["name"])
    env = rendered.config_env()
    (trigger,) = so["spec"]["triggers"]
    meta = trigger["metadata"]
    assert meta["stream"] == StreamNames(env["LS_NAMESPACE"]).router and meta["consumerGroup"] == GROUP_ROUTER
    assert int(meta["pendingEntriesCount"]) >= 1
    url = urllib.parse.urlparse(container_env(rendered, pod_spec(worker)["containers"][0])["LS_REDIS_URL"])
    assert meta["databaseIndex"] == (url.path.strip("/") or "0")
    # the password: the TriggerAuthentication's, from the Secret the services read
    auth = rendered.get("TriggerAuthentication", trigger["authenticationRef"]["name"])
    refs = {r["parameter"]: secret_stand_in(r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    if "LS_REDIS_SENTINEL" in env:  # the sentinels ask for the same password (Bitnami's chart)
        assert refs == {"password": url.password, "sentinelPassword": url.password}
        assert trigger["type"] == "redis-sentinel-streams"
        assert meta["addresses"] == env["LS_REDIS_SENTINEL"] and meta["sentinelMaster"] == env["LS_REDIS_MASTER_NAME"]
    else:
        assert refs == {"password": url.password}
        assert trigger["type"] == "redis-streams" and meta["address"] == f"{url.hostname}:{url.port}"
    assert so["spec"]["minReplicaCount"] >= 1  # a group always serves: the queue is not the load


def test_redis_is_in_the_cluster_or_found_through_sentinels(rendered: Rendered) -> None:
    env = rendered.config_env()
    redis = [w for w in rendered.workloads() if w["metadata"]["labels"].get("app.kubernetes.io/component") == "redis"]
    if "LS_REDIS_SENTINEL" in env:
        assert not redis
        CommonConfig(redis_sentinel=env["LS_REDIS_SENTINEL"])  # parses
        return
    _, router = _container(rendered, "router")
    url = urllib.parse.urlparse(container_env(rendered, router)["LS_REDIS_URL"])
    service = rendered.get("Service", url.hostname)
    assert service["spec"]["ports"][0]["port"] == url.port
    (server,) = redis
    container = server["spec"]["template"]["spec"]["containers"][0]
    args = container_argv(rendered, container)
    assert "--appendonly" in args
    # bounded below the container's memory limit, writes refused past it rather than streams evicted
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert _bytes(args[args.index("--maxmemory") + 1]) < _bytes(container["resources"]["limits"]["memory"])


def _bytes(size: str) -> int:
    """Redis's "2gb" or Kubernetes's "4Gi" in bytes."""
    units = {"gb": 1 << 30, "gi": 1 << 30, "mb": 1 << 20, "mi": 1 << 20}
    return int(size[:-2]) * units[size[-2:].lower()]


def test_volumes_are_declared_and_the_model_is_read_only(rendered: Rendered) -> None:
    claims = {o["metadata"]["name"] for o in rendered.of_kind("PersistentVolumeClaim")}
    for w in rendered.workloads():
        spec = pod_spec(w)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        templates = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        for v in volumes.values():
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims
        for c in spec.get("initContainers", []) + spec["containers"]:
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes.keys() | templates, (w["metadata"]["name"], m["name"])
        for c in spec["containers"]:
            model = [m for m in c.get("volumeMounts", []) if m["name"] == "model"]
            assert all(m.get("readOnly") for m in model), w["metadata"]["name"]
            if "model" in volumes and "emptyDir" in volumes["model"]:  # the demo model: made in the pod
                assert [i["name"] for i in spec["initContainers"]] == ["demo-model"]


def test_every_service_gives_redis_the_password_of_one_secret(rendered: Rendered) -> None:
    """Each service's LS_REDIS_URL is put together from REDIS_LOCATION and the Secret's
    password with nothing left unexpanded; the cluster's Redis asks for that password and its
    probes give it."""
    for w, c in _containers(rendered):
        if c.get("command", [])[:2] != ["python", "-m"]:
            continue  # the demo model's init container, Redis
        env = container_env(rendered, c)
        where = f"{rendered.overlay} {w['metadata']['name']}"
        assert not [k for k, v in env.items() if "$(" in v], where  # every reference defined before it
        assert urllib.parse.urlparse(env["LS_REDIS_URL"]).password == REDIS_PASSWORD, where
        if "LS_REDIS_SENTINEL" in env:  # Bitnami's sentinels ask for the same password
            assert env["LS_REDIS_SENTINEL_PASSWORD"] == REDIS_PASSWORD, where
    if "redis" not in _services(rendered):
        return  # an outside Redis: the password is its own, put in the same Secret
    _, server = _container(rendered, "redis")
    argv = container_argv(rendered, server)
    assert argv[argv.index("--requirepass") + 1] == REDIS_PASSWORD
    assert container_env(rendered, server)["REDISCLI_AUTH"] == REDIS_PASSWORD
    for probe in ("readinessProbe", "livenessProbe"):  # -e: NOAUTH or WRONGPASS fails the probe
        assert server[probe]["exec"]["command"] == ["redis-cli", "-e", "ping"], probe


def test_front_end_takes_its_keys_from_an_optional_secret(rendered: Rendered) -> None:
    _, c = _container(rendered, "tokenizer")
    (keys,) = [e for e in c["env"] if e["name"] == "LS_API_KEYS"]
    ref = keys["valueFrom"]["secretKeyRef"]
    assert ref["optional"] is True  # no Secret: open, as compose without LS_API_KEYS
    env = {k: v for k, v in container_env(rendered, c).items() if k.startswith("LS_")}
    assert parse_config(TokenizerConfig, [], env).api_keys == (secret_stand_in(ref["name"], ref["key"]),)


def test_no_secret_is_in_the_manifests_and_each_read_is_documented(rendered: Rendered) -> None:
    assert not rendered.of_kind("Secret")
    read = set()
    for _, c in _containers(rendered):
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                read.add(ref["name"])
            elif "PASSWORD" in e["name"] or "API_KEY" in e["name"] or "AUTH" in e["name"]:
                assert "$(" in e["value"], e["name"]  # only ever another variable's value
    for auth in rendered.of_kind("TriggerAuthentication"):
        read |= {r["name"] for r in auth["spec"]["secretTargetRef"]}
    assert "lightstream-redis" in read
    with open(os.path.join(ROOT, "docs", "operations.md")) as f:
        text = f.read()
    for name in read:  # the command that makes it
        assert f"kubectl create secret generic {name} " in text, name


def test_visual_replicas_encode_on_a_gpu_from_the_workers_model(rendered: Rendered) -> None:
    if "visual" not in _services(rendered):
        assert rendered.overlay != "gpu-vision"
        return
    w, c = _container(rendered, "visual")
    worker, worker_c = _container(rendered, "worker")
    env = container_env(rendered, c)
    assert env["LS_MODEL_DIR"] == container_env(rendered, worker_c)["LS_MODEL_DIR"]
    assert env["LS_DEVICE"] == "cuda" and c["image"] == "lightstream:cuda"
    for kind in ("requests", "limits"):
        assert int(c["resources"][kind]["nvidia.com/gpu"]) == 1, kind
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == env["LS_MODEL_DIR"]]
    volumes = {v["name"]: v for v in pod_spec(w)["volumes"]}
    worker_volumes = {v["name"]: v for v in pod_spec(worker)["volumes"]}
    assert volumes[mount["name"]] == worker_volumes["model"]  # the same model, read-only
    assert "persistentVolumeClaim" in volumes[mount["name"]]
