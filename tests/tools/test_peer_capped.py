"""tools/peer_capped.py: the peer script runs unchanged with its own arguments, and transformers'
continuous-batching cache fraction is capped only where the config leaves it unset (the cuBLAS
handle it pools needs CUDA: the GPU run exercises it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tools import peer_capped


def test_cap_fills_an_unset_fraction_and_keeps_a_set_one(monkeypatch) -> None:
    init = pytest.importorskip("transformers.generation.continuous_batching.initialization")
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    monkeypatch.setattr(init, "resolve_max_memory_percent", init.resolve_max_memory_percent)
    assert peer_capped.cap_cache_memory(0.7)
    unset, chosen = ContinuousBatchingConfig(), ContinuousBatchingConfig(max_memory_percent=0.5)
    init.resolve_max_memory_percent(unset, False, None)
    init.resolve_max_memory_percent(chosen, False, None)
    assert (unset.max_memory_percent, chosen.max_memory_percent) == (0.7, 0.5)


def test_the_peer_gets_its_arguments_and_its_folder_on_the_path(tmp_path) -> None:
    (tmp_path / "helper_mod.py").write_text("VALUE = 7\n")
    peer = tmp_path / "peer.py"
    peer.write_text(
        "import json, sys\nimport helper_mod\n"
        "json.dump({'argv': sys.argv[1:], 'value': helper_mod.VALUE}, open(sys.argv[-1], 'w'))\n"
    )
    out = tmp_path / "seen.json"
    code = (
        "import sys; from tools import peer_capped; peer_capped.pool_a_cublas_handle = lambda: None; "
        "peer_capped.main(sys.argv[1:])"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(peer), "--cache-memory", "0.6", "--config", "c", str(out)],
        check=True,
        cwd=peer_capped.__file__.rsplit("/tools/", 1)[0],
    )
    assert json.loads(out.read_text()) == {"argv": ["--config", "c", str(out)], "value": 7}
