"""Where a model's files are: a directory, or a Hugging Face model id found in the local Hugging
Face cache (nothing is downloaded). The cache's layout is
``<hub cache>/models--<org>--<name>/snapshots/<commit>/`` with ``refs/<revision>`` naming the
commit; the hub cache is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``. No torch: the front end resolves it too."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

MODEL_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelSourceError(ValueError):
    pass


def hub_cache(env: Mapping[str, str]) -> str:
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    home = env.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def resolve_model(name: str, env: Mapping[str, str], revision: str = "main") -> str:
    """The directory holding the model: ``name`` itself when it is one, else the snapshot of the
    Hugging Face model id ``name`` in the local cache."""
    if os.path.isdir(name) or not MODEL_ID.match(name):
        return name
    repo = os.path.join(hub_cache(env), "models--" + name.replace("/", "--"))
    if not os.path.isdir(repo):
        raise ModelSourceError(
            f"{name!r} is neither a directory nor a model in the local Hugging Face cache ({hub_cache(env)}); "
            "download it first (huggingface-cli download " + name + ") or pass its directory"
        )
    ref = os.path.join(repo, "refs", revision)
    if os.path.exists(ref):
        with open(ref) as f:
            commit = f.read().strip()
    else:
        snapshots = sorted(os.listdir(os.path.join(repo, "snapshots"))) if os.path.isdir(repo + "/snapshots") else []
        if len(snapshots) != 1:
            raise ModelSourceError(f"{name!r}: no refs/{revision} in {repo} and {len(snapshots)} snapshots")
        commit = snapshots[0]
    path = os.path.join(repo, "snapshots", commit)
    if not os.path.isdir(path):
        raise ModelSourceError(f"{name!r}: the cache names snapshot {commit}, which {repo} lacks")
    return path
