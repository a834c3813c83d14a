"""argmax_rows (split over the row, then combined) against torch.argmax."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.argmax import argmax_rows, num_splits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("rows", "cols", "sms"), [(1, 1, 4), (1, 5000, 4), (3, 2049, 4), (7, 300, 132), (2, 70_000, 132), (40, 4100, 4)]
)
def test_argmax_rows_is_torchs(rows: int, cols: int, sms: int, dtype: torch.dtype, device: torch.device) -> None:
    x = (torch.randn(rows, cols, device=device) * 4).to(dtype)
    got = argmax_rows(x, num_sms=sms)
    assert got.dtype == torch.int64
    assert torch.equal(got, x.argmax(dim=-1))


def test_ties_go_to_the_first_index_across_splits(device: torch.device) -> None:
    cols = 9000
    x = torch.zeros(4, cols, device=device)
    x[0, [17, 4000, 8999]] = 5.0  # in three splits: the first wins
    x[1, [8999, 8998]] = 2.0  # the last split's two, the lower index
    x[2] = float("-inf")  # no finite value: the first index, as torch gives
    x[3, 5] = float("nan")  # NaN is passed over
    x[3, 6000] = 1.0
    assert num_splits(4, cols, 8) > 1
    assert argmax_rows(x, num_sms=8).tolist() == [17, 8998, 0, 6000]


def test_a_strided_view_of_the_rows(device: torch.device) -> None:
    x = torch.randn(5, 3000, device=device)[:, :2500]  # the logits of a padded vocabulary
    assert torch.equal(argmax_rows(x, num_sms=4), x.argmax(dim=-1))


def test_argmax_rows_rejects_what_it_cannot_reduce(device: torch.device) -> None:
    with pytest.raises(ValueError, match="float"):
        argmax_rows(torch.zeros(2, 8, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="no columns"):
        argmax_rows(torch.zeros(2, 0, device=device))
    assert argmax_rows(torch.zeros(0, 8, device=device)).shape == (0,)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
def test_argmax_rows_llama3_vocab(rows: int, dtype: torch.dtype) -> None:
    x = (torch.randn(rows, 128256, device="cuda") * 3).to(dtype)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert torch.equal(argmax_rows(x, num_sms=sms), x.argmax(dim=-1))
