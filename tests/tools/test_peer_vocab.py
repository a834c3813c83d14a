"""tools/peer_vocab.py: prompt ids past a small vocabulary are folded into it before transformers'
continuous batching sees them, and the peer script runs unchanged with its own arguments. The
whole batching thread on a 64-token Mistral (opt-in, -m bench: about 15 s a run) fails at its
first step without the fold and finishes with it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tools import peer_vocab

api = pytest.importorskip("transformers.generation.continuous_batching.continuous_api")


class _Config:
    vocab_size = 64


class _Model:
    config = _Config()


def test_the_hook_folds_ids_and_passes_the_rest(monkeypatch) -> None:
    seen = []
    monkeypatch.setattr(
        api.ContinuousBatchingManager, "add_request", lambda self, ids, *a, **k: seen.append((ids, a, k))
    )
    assert peer_vocab.fold_prompts_into_vocab()
    manager = api.ContinuousBatchingManager.__new__(api.ContinuousBatchingManager)
    manager.model = _Model()
    manager.add_request([1000, 63, 64], request_id="r1", max_new_tokens=8)
    assert seen == [([1000 % 64, 63, 0], (), {"request_id": "r1", "max_new_tokens": 8})]


def test_the_peer_gets_its_arguments_and_its_folder_on_the_path(tmp_path) -> None:
    (tmp_path / "helper_mod.py").write_text("VALUE = 7\n")
    peer = tmp_path / "peer.py"
    peer.write_text(
        "import json, sys\nimport helper_mod\n"
        "json.dump({'argv': sys.argv[1:], 'value': helper_mod.VALUE}, open(sys.argv[-1], 'w'))\n"
    )
    out = tmp_path / "seen.json"
    root = peer_vocab.__file__.rsplit("/tools/", 1)[0]
    subprocess.run([sys.executable, "tools/peer_vocab.py", str(peer), "--config", "c", str(out)], check=True, cwd=root)
    assert json.loads(out.read_text()) == {"argv": ["--config", "c", str(out)], "value": 7}


CB_RUN = """
import sys, torch
from transformers import GenerationConfig, MistralConfig, MistralForCausalLM
from tools import peer_vocab
if sys.argv[1] == "fold":
    peer_vocab.fold_prompts_into_vocab()
cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
torch.manual_seed(0)
model = MistralForCausalLM(cfg).eval()
gc = GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
manager = model.init_continuous_batching(generation_config=gc)
manager.start()
try:
    manager.add_request(list(range(1000, 1010)), request_id="a", max_new_tokens=4)
    r = manager.get_result(timeout=60)
    print("RESULT", len(r.generated_tokens), r.error)
finally:
    manager.stop(block=True, timeout=10)
"""


@pytest.mark.bench
@pytest.mark.parametrize("mode", ["fold", "plain"])
def test_the_batching_thread_on_a_small_vocabulary(mode) -> None:
    root = peer_vocab.__file__.rsplit("/tools/", 1)[0]
    got = subprocess.run([sys.executable, "-c", CB_RUN, mode], capture_output=True, text=True, cwd=root, timeout=180)
    result = [line for line in got.stdout.splitlines() if line.startswith("RESULT")]
    assert result, got.stderr[-2000:]
    if mode == "fold":
        assert result[0] == "RESULT 4 None"
    else:
        assert "index out of range" in result[0]
