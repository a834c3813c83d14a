"""A Hugging Face model id resolved in the local cache, as the hub lays it out."""

from __future__ import annotations

import pytest

from shared.model_source import ModelSourceError, resolve_model


def _cache(root, repo: str, commit: str, ref: bool = True) -> str:
    base = root / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    if ref:
        (base / "refs").mkdir()
        (base / "refs" / "main").write_text(commit)  # as the hub writes it: no newline
    return str(snap)


def test_a_model_id_is_its_snapshot_in_the_hub_cache(tmp_path) -> None:
    snap = _cache(tmp_path / "hub", "org/model-1.5B", "abc123")
    assert resolve_model("org/model-1.5B", {"HF_HUB_CACHE": str(tmp_path / "hub")}) == snap
    assert resolve_model("org/model-1.5B", {"HF_HOME": str(tmp_path)}) == snap  # HF_HOME/hub


def test_directories_and_other_names_pass_through(tmp_path, monkeypatch) -> None:
    d = tmp_path / "org" / "m"
    d.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("org/m", {"HF_HUB_CACHE": str(tmp_path / "none")}) == "org/m"  # a directory wins
    assert resolve_model("/abs/path/x", {}) == "/abs/path/x"  # not an id: left to the directory check


def test_a_model_id_not_in_the_cache_says_so(tmp_path) -> None:
    with pytest.raises(ModelSourceError, match=r"local Hugging Face cache .* HF_HUB_OFFLINE is set"):
        resolve_model("org/absent", {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    # no network here: the download is tried and its failure named
    with pytest.raises(ModelSourceError, match="downloading it failed"):
        resolve_model("org/absent", {"HF_HUB_CACHE": str(tmp_path)})
