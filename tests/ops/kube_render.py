"""deploy/kubernetes's overlays as `kubectl kustomize` renders them, indexed for the tests:
objects by kind and name, each workload's pod template, and each container's environment."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

import yaml

from tests.ops.compose_local import DOCKERFILE, ROOT

KUBE = os.path.join(ROOT, "deploy", "kubernetes")
OVERLAYS = tuple(sorted(os.listdir(os.path.join(KUBE, "overlays"))))
WORKLOADS = ("Deployment", "StatefulSet")
FIELD_STAND_IN = "pod-name-0"  # what a valueFrom field gives, for parsing the environment here
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def kubectl() -> str | None:
    return shutil.which("kubectl")


@dataclass
class Rendered:
    overlay: str
    objects: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.overlay}: no single {kind} {name}"
        return found[0]

    def workloads(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] in WORKLOADS]

    def component(self, name: str) -> dict[str, Any]:
        """The workload of a service (tokenizer, router, worker, detokenizer, visual, redis)."""
        found = [w for w in self.workloads() if w["metadata"]["labels"].get("app.kubernetes.io/component") == name]
        assert len(found) == 1, f"{self.overlay}: no single workload for {name}"
        return found[0]

    def config_env(self) -> dict[str, str]:
        return dict(self.get("ConfigMap", "lightstream-env")["data"])


def render(overlay: str) -> Rendered:
    out = subprocess.run(
        [kubectl() or "kubectl", "kustomize", os.path.join(KUBE, "overlays", overlay)],
        capture_output=True,
        text=True,
        check=True,
    )
    return Rendered(overlay, [o for o in yaml.safe_load_all(out.stdout) if o])


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def secret_stand_in(name: str, key: str) -> str:
    """What a Secret's key gives a container, here (no cluster, no Secret): its name and key."""
    return f"{name}.{key}"


def expand(text: str, env: dict[str, str]) -> str:
    """$(NAME) replaced by NAME's value as the kubelet does: left as it is when NAME is not
    defined before it; $$ is a dollar."""
    return _REFERENCE.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def container_env(rendered: Rendered, container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet gives it: envFrom's ConfigMaps, then env in
    order, each value's $(NAME) expanded (a field reference stands in as FIELD_STAND_IN, a
    Secret's key as secret_stand_in)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(rendered.get("ConfigMap", source["configMapRef"]["name"])["data"])
    for item in container.get("env", []):
        secret = item.get("valueFrom", {}).get("secretKeyRef")
        if secret is not None:
            env[item["name"]] = secret_stand_in(secret["name"], secret["key"])
        else:
            env[item["name"]] = expand(item["value"], env) if "value" in item else FIELD_STAND_IN
    return env


def container_argv(rendered: Rendered, container: dict[str, Any]) -> list[str]:
    """command + args, each $(NAME) expanded from the container's environment."""
    env = container_env(rendered, container)
    return [expand(a, env) for a in container.get("command", []) + container.get("args", [])]


def dockerfile_targets() -> set[str]:
    with open(DOCKERFILE) as f:
        return set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", f.read(), flags=re.M | re.I))


def dockerfile_copies() -> set[str]:
    """The top-level paths of this repository the images copy."""
    with open(DOCKERFILE) as f:
        return set(re.findall(r"^COPY\s+(\S+)\s", f.read(), flags=re.M))
