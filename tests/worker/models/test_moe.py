"""The mixture-of-experts families (models/moe.py, mixtral.py, qwen_moe.py) on the CPU path
against Hugging Face: every position's logits from a prefill and from decode steps, the routers'
weights and choices, dense layers among sparse ones, each tensor-parallel rank's share of the
experts, and the norms left unfolded. Greedy outputs are compared in tests/worker/test_moe_vs_hf.py."""

from __future__ import annotations

import functools

import pytest
import torch

from services.worker.build import build_engine
from services.worker.models.layers.moe import route
from services.worker.models.layers.ops import TorchOps
from services.worker.models.mixtral import MixtralModel
from services.worker.models.qwen3 import Qwen3LayerWeights
from services.worker.models.qwen_moe import Qwen3MoeModel
from services.worker.models.registry import family_of, load_weights
from services.worker.runtime.folding import fold_norms_
from services.worker.tp.parallel import TensorParallel
from shared.config import WorkerConfig
from shared.model_config import ModelConfig
from tests import hf_reference
from tests.worker.teacher_forcing import decode_logits, prefill_logits
from tools import make_tiny_model

TEXTS = ("Once upon a time there was a small town by the sea", "Hello world, again and again")
MOE = ["mixtral", "qwen2_moe", "qwen3_moe"]


@functools.cache
def _hf_model(model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _hf_logits(model_dir: str, ids: list[int]) -> torch.Tensor:
    """[L, V] float32: Hugging Face's logits after each position of ids."""
    with torch.no_grad():
        return _hf_model(model_dir)(torch.tensor([ids])).logits[0]


def _engine(model_dir: str):
    return build_engine(WorkerConfig(model_dir=model_dir, device="cpu"))


def _check_logits(model_dir: str) -> None:
    engine = _engine(model_dir)
    tok = hf_reference.tokenizer(model_dir)
    seqs = [tok(t)["input_ids"] for t in TEXTS]
    for ids in seqs:
        torch.testing.assert_close(prefill_logits(engine, ids), _hf_logits(model_dir, ids), rtol=1e-4, atol=1e-4)
    for ids, got in zip(seqs, decode_logits(engine, seqs, start=3), strict=True):
        torch.testing.assert_close(got, _hf_logits(model_dir, ids)[3 : 3 + len(got)], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", MOE)
def test_prefill_and_decode_logits_match_hf(tiny_moe_models: dict[str, str], arch: str) -> None:
    _check_logits(tiny_moe_models[arch])


@pytest.fixture(scope="module")
def with_dense_layers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Qwen MoE models of three layers whose middle one is dense (mlp_only_layers)."""
    out = {}
    for arch in ("qwen2_moe", "qwen3_moe"):
        path = str(tmp_path_factory.mktemp(f"dense-{arch}"))
        make_tiny_model.main(["--out", path, "--arch", arch, "--layers", "3", "--mlp-only-layers", "1"])
        out[arch] = path
    return out


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe"])
def test_a_dense_layer_among_sparse_ones_matches_hf(with_dense_layers: dict[str, str], arch: str) -> None:
    model_dir = with_dense_layers[arch]
    layers = _engine(model_dir).runner.model.w.layers
    assert [layer.experts is None for layer in layers] == [False, True, False]
    assert layers[1].gate_up.shape == (2 * 128, 64)  # --intermediate: the dense MLP's width
    _check_logits(model_dir)


def test_each_family_is_built_with_what_sets_it_apart(tiny_moe_models: dict[str, str]) -> None:
    mixtral = _engine(tiny_moe_models["mixtral"]).runner.model
    assert isinstance(mixtral, MixtralModel) and mixtral.float32_routing_weights
    assert all(layer.gate_up is None and layer.experts is not None for layer in mixtral.w.layers)
    assert mixtral.w.layers[0].experts.w13.shape == (4, 2 * 48, 64)  # [E, 2I, H]
    qwen2 = _engine(tiny_moe_models["qwen2_moe"]).runner.model
    layer = qwen2.w.layers[0]
    assert layer.experts.router.shape == (5, 64)  # 4 experts and the shared expert's gate
    assert layer.gate_up.shape == (2 * 96, 64) and layer.qkv_bias is not None  # the shared expert, Qwen2's bias
    qwen3 = _engine(tiny_moe_models["qwen3_moe"]).runner.model
    assert isinstance(qwen3, Qwen3MoeModel) and isinstance(qwen3.w.layers[0], Qwen3LayerWeights)
    assert qwen3.w.layers[0].experts.router.shape == (4, 64) and qwen3.w.layers[0].gate_up is None


@pytest.mark.parametrize("arch", MOE)
def test_the_norms_are_not_folded_and_each_projection_name_has_one_shape(
    tiny_moe_models: dict[str, str], arch: str
) -> None:
    model = _engine(tiny_moe_models[arch]).runner.model
    norms = [layer.mlp_norm.clone() for layer in model.w.layers]
    assert not model.folds_norms and model.fold_pairs() == [] and not fold_norms_(model)
    assert all(torch.equal(n, layer.mlp_norm) for n, layer in zip(norms, model.w.layers, strict=True))
    projections = model.projections()
    assert ("shared_gate_up" in projections) == (arch == "qwen2_moe") and "gate_up" not in projections
    for name, weights in projections.items():  # the BLAS choice times one input shape per name
        assert len({tuple(w.shape) for w in weights}) == 1, name


class _PartialSums(TensorParallel):
    """A rank of two whose all-reduce leaves its partial sum, to be added up by the test."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.mark.parametrize("arch", MOE)
def test_two_ranks_shares_of_the_experts_sum_to_the_whole(tiny_moe_models: dict[str, str], arch: str) -> None:
    """Each rank holds its rows of every expert's gate and up (and of the shared expert's), its
    columns of every down, and the router whole: the ranks' MLP outputs add up to one rank's."""
    model_dir = tiny_moe_models[arch]
    cfg = ModelConfig.from_dir(model_dir)
    family = family_of(cfg)

    def model(tp: TensorParallel):
        w = load_weights(model_dir, cfg, torch.float32, "cpu", tp, progress=False)
        return family.model(cfg, w, TorchOps(), None, None, tp)

    whole, ranks = model(TensorParallel()), [model(_PartialSums(r, 2)) for r in range(2)]
    x = torch.randn(7, cfg.hidden_size)
    for i, layer in enumerate(whole.w.layers):
        assert torch.equal(ranks[0].w.layers[i].experts.router, layer.experts.router)
        assert ranks[0].w.layers[i].experts.w13.shape[1] == layer.experts.w13.shape[1] // 2
        parts = sum(r._mlp(r.w.layers[i], x) for r in ranks)
        torch.testing.assert_close(parts, whole._mlp(layer, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("renormalize", "dtype"), [(True, torch.float32), (False, torch.bfloat16)])
def test_route_is_hugging_faces_routers(renormalize: bool, dtype: torch.dtype) -> None:
    """Mixtral's router (renormalised, float32 weights) and Qwen2-MoE's (norm_topk_prob false,
    weights rounded to the logits' dtype), on the same logits."""
    from transformers import MixtralConfig, Qwen2MoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter

    h, e, k = 32, 6, 2
    if renormalize:
        hf = MixtralTopKRouter(MixtralConfig(hidden_size=h, num_local_experts=e, num_experts_per_tok=k))
    else:
        hf = Qwen2MoeTopKRouter(Qwen2MoeConfig(hidden_size=h, num_experts=e, num_experts_per_tok=k))
    hf = hf.to(dtype)
    torch.nn.init.normal_(hf.weight, std=h**-0.5)
    x = torch.randn(9, h).to(dtype)
    with torch.no_grad():
        logits, want_weights, want_ids = hf(x)
    weights, ids = route(logits, k, renormalize, torch.float32 if renormalize else dtype)
    assert torch.equal(ids, want_ids) and weights.dtype == want_weights.dtype
    torch.testing.assert_close(weights, want_weights, rtol=0, atol=0)
