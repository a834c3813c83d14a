"""Small host -> device copies that never wait for the device.

A copy from ordinary (pageable) host memory may block the host until the device has
drained its queue, which would undo the overlap of host and device work; from pinned
memory it is queued like a kernel. PyTorch caches pinned blocks, so this stays cheap.
"""

from __future__ import annotations

import torch


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    pinned = device.type == "cuda"
    return torch.tensor(values, dtype=dtype, pin_memory=pinned).to(device, non_blocking=True)
