"""tools/stack.py's command lines and environments, without starting anything."""

from __future__ import annotations

from tools.stack import Stack, StackOptions


def test_each_worker_group_can_have_gpus_of_its_own() -> None:
    def gpus(**kw) -> list[str | None]:
        stack = Stack(StackOptions(model_dir="m", redis_url="redis://x", port=1, workers=2, **kw))
        return [stack.services[f"worker-{g}"].env.get("CUDA_VISIBLE_DEVICES") for g in range(2)]

    assert gpus() == [None, None]  # every group sees every GPU
    assert gpus(gpus_per_worker=1) == ["0", "1"]
    assert gpus(gpus_per_worker=2) == ["0,1", "2,3"]


def test_a_service_runs_under_its_prefix_and_the_rest_as_they_are(tmp_path) -> None:
    # echo in place of `ip netns exec NS`: the log shows the command line the prefix was given
    opts = StackOptions(
        model_dir="m", redis_url="redis://x", port=1, log_dir=str(tmp_path), prefixes={"router": ["echo"]}
    )
    stack = Stack(opts)
    stack.start_service("router")
    assert stack.services["router"].proc.wait(10) == 0  # type: ignore[union-attr]
    said = (tmp_path / "router.log").read_text().split()
    assert said[1:] == ["-m", "services.router", *stack.services["router"].args]


def test_secrets_reach_the_services_in_their_environment_never_their_command_lines(tmp_path) -> None:
    """/proc/<pid>/cmdline is every user's to read, /proc/<pid>/environ only the owner's."""
    url = "redis://:s3cret@127.0.0.1:6379/0"
    opts = StackOptions(
        model_dir="m",
        redis_url=url,
        port=1,
        fronts=2,
        log_dir=str(tmp_path),
        tokenizer_env={"LS_API_KEYS": "k"},
        prefixes={"tokenizer-1": ["sh", "-c", 'echo "$LS_REDIS_URL $LS_API_KEYS $*"', "sh"]},
    )
    stack = Stack(opts)
    for svc in stack.services.values():
        assert not any("s3cret" in a for a in svc.args), svc.name
    assert stack.services["tokenizer"].env == {"LS_API_KEYS": "k"} and stack.services["router"].env == {}
    stack.start_service("tokenizer-1")
    assert stack.services["tokenizer-1"].proc.wait(10) == 0  # type: ignore[union-attr]
    said = (tmp_path / "tokenizer-1.log").read_text().split()
    assert said[:2] == [url, "k"] and "services.tokenizer" in said
