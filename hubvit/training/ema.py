"""Model EMA: an exponential moving average of the weights, evaluated and saved beside the trained model.

Built on `torch.optim.swa_utils.AveragedModel` with `get_ema_multi_avg_fn(decay)`: after every optimizer update,
ema = decay * ema + (1 - decay) * weights; the first update copies the weights. Buffers are averaged too
(`use_buffers=True`), as timm's `ModelEmaV3` does. DeiT uses decay 0.99996 over 300 ImageNet epochs.
"""

from __future__ import annotations

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from ..errors import HubViTError


class EMAError(HubViTError):
    """An EMA decay outside (0, 1)."""


def model_ema(model: torch.nn.Module, decay: float) -> AveragedModel:
    """An `AveragedModel` of `model` (the unwrapped module, not its DDP/FSDP wrapper) with EMA averaging."""
    if not 0.0 < decay < 1.0:
        raise EMAError(f"--ema_decay must be in (0, 1), got {decay}")
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)


@torch.no_grad()
def update_ema(ema: AveragedModel, model: torch.nn.Module) -> None:
    """One EMA step after an optimizer update (call only when gradients were synchronised)."""
    ema.update_parameters(model)
