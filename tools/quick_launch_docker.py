"""Launch LightStream in Docker with one command: LightLLM's tools/quick_launch_docker.py,
reimagined with the docker SDK.

    python tools/quick_launch_docker.py [--model-dir DIR] [--port 8000] [--gpus all] [--tp 2]
        [--shm-size 32g] [--max-total-token-num N] [other serving options] [--dry-run]
    python tools/quick_launch_docker.py --compose [--workers 2] [--detokenizers 2] [--tokenizers 2] ...

By default one all-in-one container runs Redis and the four services (tools/run_local.py);
with --compose the stack of compose.yaml starts instead (compose.gpu.yaml added for GPUs),
one container per service replica. The image is built from this repository when it is
missing (or with --build) and reused otherwise. The helper waits until /health answers,
then prints the URL, a curl line, and where the logs and metrics are. --dry-run prints the
docker commands it would run and touches nothing. Without --model-dir it serves the tiny
demo model; without --gpus, on the CPU. Every option: --help, and docs/operations.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

import httpx

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.launch_plan import (
    HTTP_PORT,
    METRICS_PORTS,
    MODEL_MOUNT,
    REDIS_URL,
    ROOT,
    SERVING_OPTIONS,
    ComposePlan,
    ContainerPlan,
    Gpus,
    override_path,
    service_env,
    service_flags,
)

# the all-in-one container starts its Redis on a known port (so `python -m tools.inspect` finds
# it), waits for it, then becomes run_local.py; the container stopping stops both
REDIS_THEN_EXEC = (
    'redis-server --port 6379 --bind 127.0.0.1 --save "" --appendonly no >/dev/null & '
    "until redis-cli -p 6379 ping >/dev/null 2>&1; do sleep 0.1; done; "
    'exec "$@"'
)
CURL = "curl {url}/generate -H 'Content-Type: application/json' -d '{body}'"
CURL_BODY = '{"inputs": "What is AI?", "parameters": {"max_new_tokens": 17}}'


class UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    serve = ap.add_argument_group("model and serving")
    serve.add_argument("--model-dir", "--model", "-m", default="", help="model directory; default: the demo model")
    serve.add_argument("--port", "-p", type=int, default=8000, help="host port of the HTTP API")
    serve.add_argument("--gpus", default="none", help="none (the CPU), all, a count, or device ids: 0,1")
    for opt in SERVING_OPTIONS:
        serve.add_argument(opt.flag, *opt.aliases, dest=opt.dest, type=opt.type, default=None, help=opt.help)
    serve.add_argument("--api-key", action="append", default=[], help="a key clients must send (repeatable)")
    serve.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING or ERROR")
    box = ap.add_argument_group("container")
    box.add_argument("--image", default="lightstream", help="image repository; tags are Dockerfile targets (cpu, cuda)")
    box.add_argument("--build", action="store_true", help="build the image even when it exists")
    box.add_argument("--name", default="lightstream", help="container name (compose project name with --compose)")
    box.add_argument("--replace", action="store_true", help="remove a container of the same name first")
    box.add_argument("--shm-size", default="", help="/dev/shm size; default: half the RAM with GPUs, 1g without")
    box.add_argument("--rm", action="store_true", help="remove the container when it stops")
    box.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="publish the router's, worker's, detokenizer's /metrics at P, P+1, P+2",
    )
    stack = ap.add_argument_group("compose")
    stack.add_argument("--compose", action="store_true", help="start compose.yaml's stack instead of one container")
    stack.add_argument("--workers", type=int, default=1, help="worker groups (data parallelism); --compose")
    stack.add_argument("--detokenizers", type=int, default=1, help="detokenizer shards; --compose")
    stack.add_argument("--tokenizers", type=int, default=1, help="front ends, on ports PORT, PORT+1, ...; --compose")
    ap.add_argument("--wait-s", type=float, default=900.0, help="how long to wait for /health")
    ap.add_argument("--dry-run", action="store_true", help="print what would run; touch nothing")
    return ap


def check(args: argparse.Namespace) -> Gpus:
    gpus = Gpus(args.gpus)
    if args.model_dir and not os.path.isfile(os.path.join(args.model_dir, "config.json")):
        raise UsageError(f"--model-dir {args.model_dir}: no config.json there")
    if not args.compose and (args.workers, args.detokenizers, args.tokenizers) != (1, 1, 1):
        raise UsageError("--workers, --detokenizers and --tokenizers need --compose")
    if args.compose and args.metrics_port:
        raise UsageError("--metrics-port is for the single container; with --compose use --profile monitoring")
    if args.compose and gpus.ids:
        raise UsageError("with --compose, --gpus is a count or all (Docker gives every worker replica the same GPUs)")
    if args.compose and not gpus.none and not args.model_dir:
        raise UsageError("with --compose, --gpus needs --model-dir")
    n = gpus.count()
    if not gpus.none and args.tp and n is not None and args.tp > n:
        raise UsageError(f"--tp {args.tp} needs {args.tp} GPUs, --gpus {args.gpus} gives {n}")
    return gpus


def shm_size(args: argparse.Namespace, gpus: Gpus) -> str:
    if args.shm_size:
        return args.shm_size
    if gpus.none:
        return "1g"
    # LightLLM's default: NCCL between tensor-parallel ranks goes through /dev/shm
    return f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') // 2**31}g"


def container_plan(args: argparse.Namespace, gpus: Gpus) -> ContainerPlan:
    flags = service_flags(vars(args), args.api_key)
    flags.setdefault("tokenizer", []).append(("--host", "0.0.0.0"))  # reachable through the published port
    flags.setdefault("worker", []).append(("--device", "cpu" if gpus.none else "cuda"))
    for service, port in METRICS_PORTS.items():
        flags.setdefault(service, []).append(("--metrics-port", str(port)))
    run_local = ["python", "tools/run_local.py", "--port", str(HTTP_PORT)]
    if args.model_dir:
        run_local += ["--model-dir", MODEL_MOUNT]
    for service in ("tokenizer", "router", "worker", "detokenizer"):
        run_local += [f"--{service}-arg={flag}={value}" for flag, value in flags.get(service, [])]
    env = {"REDIS_URL": REDIS_URL, "LS_REDIS_URL": REDIS_URL}
    if args.log_level:
        env["LS_LOG_LEVEL"] = args.log_level
    ports = {HTTP_PORT: args.port}
    if args.metrics_port:
        ports.update({inner: args.metrics_port + i for i, inner in enumerate(METRICS_PORTS.values())})
    target = "cpu" if gpus.none else "cuda"
    return ContainerPlan(
        image=f"{args.image}:{target}",
        target=target,
        build=args.build,
        name=args.name,
        command=["sh", "-c", REDIS_THEN_EXEC, "sh", *run_local],
        ports=ports,
        volumes={os.path.abspath(args.model_dir): MODEL_MOUNT} if args.model_dir else {},
        environment=env,
        gpus=gpus,
        shm_size=shm_size(args, gpus),
        remove=args.rm,
        replace=args.replace,
    )


def compose_plan(args: argparse.Namespace, gpus: Gpus) -> ComposePlan:
    env = {
        "LS_IMAGE": args.image,
        "LS_HTTP_PORT": str(args.port),
        "LS_HTTP_PORT_LAST": str(args.port + args.tokenizers - 1),
        "LS_SHM_SIZE": shm_size(args, gpus),
    }
    if args.model_dir:
        env["MODEL_DIR"] = os.path.abspath(args.model_dir)
    if not gpus.none:
        env["LS_GPUS"] = gpus.spec
    if args.log_level:
        env["LS_LOG_LEVEL"] = args.log_level
    per_service = service_env(service_flags(vars(args), args.api_key))
    override = {"services": {s: {"environment": e} for s, e in sorted(per_service.items())}}
    return ComposePlan(
        project=args.name,
        files=["compose.yaml"] + ([] if gpus.none else ["compose.gpu.yaml"]),
        env=env,
        override=override,
        scale={"worker": args.workers, "detokenizer": args.detokenizers, "tokenizer": args.tokenizers},
        build=args.build,
        override_path=override_path(args.name),
    )


def compose_command() -> list[str]:
    """`docker compose` (the v2 plugin) when it is there, else docker-compose (v1)."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise UsageError("neither `docker compose` nor docker-compose is installed")


def launch_container(plan: ContainerPlan) -> Callable[[], str | None]:
    """Start the container; -> a check that says why it stopped (None while it runs)."""
    import docker  # only here: --dry-run needs no docker package and no engine

    client = docker.from_env()
    try:
        client.images.get(plan.image)
        present = True
    except docker.errors.ImageNotFound:
        present = False
    if plan.build or not present:
        print(f"building {plan.image} (target {plan.target}) from {ROOT}", flush=True)
        client.images.build(path=ROOT, target=plan.target, tag=plan.image, rm=True)
    else:
        print(f"reusing image {plan.image} (--build to rebuild)", flush=True)
    if plan.replace:
        with contextlib.suppress(docker.errors.NotFound):
            client.containers.get(plan.name).remove(force=True)
    container = client.containers.run(plan.image, plan.command, **plan.sdk_kwargs())

    def stopped() -> str | None:
        try:
            container.reload()
        except docker.errors.NotFound:
            return "the container is gone"
        if container.status in ("exited", "dead"):
            return "the container stopped:\n" + container.logs(tail=40).decode(errors="replace")
        return None

    return stopped


def launch_compose(plan: ComposePlan, compose: list[str]) -> Callable[[], str | None]:
    if plan.override_path in plan.all_files:
        os.makedirs(os.path.dirname(plan.override_path), exist_ok=True)
        with open(plan.override_path, "w") as f:
            f.write(plan.override_text())
    subprocess.run([*compose, *plan.up_args()], cwd=ROOT, env={**os.environ, **plan.env}, check=True)
    return lambda: None  # compose restarts what stops; /health says when it serves


def wait_healthy(url: str, stopped: Callable[[], str | None], timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        why = stopped()
        if why:
            raise RuntimeError(why)
        time.sleep(1.0)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s:.0f}s")


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.model_dir and args.model_name is None:  # clients see the model's name, not its mount point's
        args.model_name = os.path.basename(os.path.normpath(args.model_dir))
    try:
        gpus = check(args)
        plan: ContainerPlan | ComposePlan = compose_plan(args, gpus) if args.compose else container_plan(args, gpus)
        compose = (["docker", "compose"] if args.dry_run else compose_command()) if args.compose else []
    except UsageError as e:
        ap.error(str(e))
    url = f"http://127.0.0.1:{args.port}"
    if args.dry_run:
        print("# quick_launch_docker.py --dry-run: nothing is run")
        lines = plan.lines(compose) if isinstance(plan, ComposePlan) else plan.lines()
        print("\n".join([*lines, f"# then wait up to {args.wait_s:.0f}s for {url}/health"]))
        return 0
    if isinstance(plan, ComposePlan):
        stopped = launch_compose(plan, compose)
        where = f"logs: {' '.join(compose)} -p {plan.project} logs -f [tokenizer|router|worker|detokenizer]"
        inspect = f"{' '.join(compose)} -p {plan.project} exec router python -m tools.inspect"
        stop = f"{' '.join(compose)} -p {plan.project} down"
    else:
        stopped = launch_container(plan)
        where = f"logs: docker logs -f {plan.name}  (one line per event: service/replica rid=...)"
        inspect = f"docker exec {plan.name} python -m tools.inspect"
        stop = f"docker rm -f {plan.name}"
    print(f"waiting for {url}/health ...", flush=True)
    try:
        wait_healthy(url, stopped, args.wait_s)
    except (RuntimeError, TimeoutError) as e:
        print(f"LightStream did not come up: {e}", file=sys.stderr)
        return 1
    print(f"LightStream is serving at {url}")
    print(f"  try:     {CURL.format(url=url, body=CURL_BODY)}")
    print(
        f"  metrics: {url}/metrics"
        + (f" and ports {args.metrics_port}-{args.metrics_port + 2}" if args.metrics_port else "")
    )
    print(f"  {where}")
    print(f"  inspect: {inspect}")
    print(f"  stop:    {stop}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
