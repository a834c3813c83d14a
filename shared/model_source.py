"""Where a model's files are: a directory, or a Hugging Face model id, resolved through
huggingface_hub: the local cache first (nothing fetched), else a download with its progress
bars unless HF_HUB_OFFLINE is set. The hub cache is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``,
else ``~/.cache/huggingface/hub``."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

MODEL_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# what serving needs of a repository: no other formats' copies of the weights, no images
FILES = ["*.json", "*.safetensors", "*.bin", "*.model", "*.tiktoken", "*.txt", "*.jinja"]


class ModelSourceError(ValueError):
    pass


def hub_cache(env: Mapping[str, str]) -> str:
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    home = env.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def resolve_model(name: str, env: Mapping[str, str], revision: str | None = None) -> str:
    """The directory holding the model: ``name`` itself when it is one (or does not look like a
    model id), else the snapshot of the Hugging Face model id ``name``."""
    if os.path.isdir(name) or not MODEL_ID.match(name):
        return name
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise ModelSourceError(f"{name!r} is not a directory, and huggingface_hub is not installed") from None
    cache = hub_cache(env)
    try:
        return snapshot_download(name, revision=revision, cache_dir=cache, allow_patterns=FILES, local_files_only=True)
    except LocalEntryNotFoundError:
        if env.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
            raise ModelSourceError(
                f"{name!r} is neither a directory nor a model in the local Hugging Face cache ({cache}), "
                "and HF_HUB_OFFLINE is set"
            ) from None
    try:
        return snapshot_download(name, revision=revision, cache_dir=cache, allow_patterns=FILES)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelSourceError(
            f"{name!r} is neither a directory nor a model in the local Hugging Face cache ({cache}), "
            f"and downloading it failed: {first}"
        ) from None
