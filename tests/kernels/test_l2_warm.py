"""l2_warm reads every word of its tensor once: each program's fold is the XOR of its block."""

from __future__ import annotations

import numpy as np
import torch

from services.worker.kernels.l2_warm import BLOCK, fold_size, l2_warm, warm_words


def test_l2_warm_folds_every_block(device: torch.device) -> None:
    x = torch.randn(3, BLOCK + 78, dtype=torch.bfloat16, device=device)  # a partial last block
    words = warm_words(x)
    fold = torch.zeros(fold_size(words), dtype=torch.int32, device=device)
    l2_warm(words, fold)
    flat = words.cpu().numpy()
    want = [int(np.bitwise_xor.reduce(flat[i * BLOCK : (i + 1) * BLOCK])) for i in range(fold.numel())]
    assert fold.cpu().tolist() == want
    assert torch.equal(words.view(torch.bfloat16).view(x.shape), x)  # read only
