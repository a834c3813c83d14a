"""M-RoPE's positions (services/worker/mrope_index.py) against Hugging Face's get_rope_index, and
the rotary rows they gather (models/layers/mrope.py): three equal positions are ordinary rotary."""

from __future__ import annotations

import pytest
import torch

from services.worker.models.layers.mrope import mrope_cos_sin, section_streams
from services.worker.models.layers.rope import cos_sin_table
from services.worker.mrope_index import rope_index
from tests import qwen_vl_reference as ref


def _layout(image_id: int, grids: list[tuple[int, int, int]], texts: list[int]) -> tuple[list[int], list]:
    """texts[i] text tokens (id 1), then image i's tokens; texts has one more entry than grids.
    -> (ids, each image's (offset, grid))."""
    ids, images = [1] * texts[0], []
    for (t, h, w), n in zip(grids, texts[1:], strict=True):
        images.append((len(ids), (t, h, w)))
        ids += [image_id] * (t * h * w) + [1] * n
    return ids, images


@pytest.mark.parametrize(
    "grids, texts",
    [
        ([(1, 2, 3)], [4, 5]),
        ([(1, 3, 2), (1, 5, 7)], [2, 1, 3]),  # two images, one token between them
        ([(1, 4, 4)], [3, 0]),  # the prompt ends on the image
        ([(1, 1, 1), (1, 2, 2)], [0, 2, 1]),  # it starts on one
    ],
)
@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl"])
def test_positions_match_hf(tiny_vl_models: dict[str, str], arch: str, grids, texts) -> None:
    model = ref.model(tiny_vl_models[arch])
    image_id = model.config.image_token_id
    ids, images = _layout(image_id, grids, texts)
    got = rope_index(len(ids), images)
    hf_grids = torch.tensor([(t, 2 * h, 2 * w) for t, h, w in grids])  # in patches, before the 2x2 merge
    t = torch.tensor([ids])
    want, delta = model.model.get_rope_index(t, mm_token_type_ids=(t == image_id).int(), image_grid_thw=hf_grids)
    assert torch.tensor(got.prompt).tolist() == want[:, 0].tolist()
    assert got.delta == int(delta)
    # later tokens: HF's decode positions are cache length + delta in all three streams
    assert got.rows(len(ids), 3) == ([len(ids) + got.delta + i for i in range(3)],) * 3


def test_rows_span_prompt_and_output() -> None:
    pos = rope_index(6, [(1, (1, 2, 2))])
    assert pos.prompt == ((0, 1, 1, 1, 1, 3), (0, 1, 1, 2, 2, 3), (0, 1, 2, 1, 2, 3))
    assert pos.delta == 4 - 6
    assert pos.rows(4, 4) == ([1, 3, 4, 5], [2, 3, 4, 5], [2, 3, 4, 5])


def test_images_must_lie_in_order_within_the_prompt() -> None:
    with pytest.raises(ValueError, match="not in order"):
        rope_index(4, [(1, (1, 2, 2))])  # runs past the end
    with pytest.raises(ValueError, match="not in order"):
        rope_index(9, [(1, (1, 2, 2)), (3, (1, 1, 1))])  # overlaps the first


def test_equal_streams_are_ordinary_rotary() -> None:
    table = cos_sin_table(16, 1e6, {}, 64, "cpu")
    positions = torch.tensor([3, 0, 17, 63])
    streams = section_streams((2, 3, 3), "cpu")
    torch.testing.assert_close(mrope_cos_sin(table, positions.expand(3, -1), streams), table[positions], rtol=0, atol=0)


def test_sections_take_their_stream() -> None:
    table = cos_sin_table(16, 1e6, {}, 64, "cpu")
    got = mrope_cos_sin(table, torch.tensor([[5], [9], [40]]), section_streams((2, 3, 3), "cpu"))[0]
    for col, stream_pos in enumerate([5, 5, 9, 9, 9, 40, 40, 40] * 2):
        assert got[col] == table[stream_pos, col]
