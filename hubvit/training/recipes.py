"""Named fine-tuning recipes with their published values, applied as defaults for the flags a user left unset.

Each value names its source; the batch-dependent learning rates are the published base rates scaled linearly from
their reference batch to the run's global batch, as each source does.

- DeiT: Touvron et al., "Training data-efficient image transformers & distillation through attention" (ICML 2021),
  Table 9 and facebookresearch/deit `main.py` defaults: AdamW, lr 5e-4 per 512 images, weight decay 0.05, cosine
  schedule, 5 warmup epochs of 300, label smoothing 0.1, RandAugment 2 ops magnitude 9, mixup 0.8, cutmix 1.0,
  random erasing 0.25, stochastic depth 0.1, EMA 0.99996.
- AugReg: Steiner et al., "How to train your ViT? Data, Augmentation, and Regularization in Vision Transformers"
  (TMLR 2022), section 3.3 (fine-tuning): SGD with momentum 0.9, batch 512, cosine schedule, no weight decay,
  gradient clipping at global norm 1, learning rate from {0.001, 0.003, 0.01, 0.03} (0.03 listed here), no
  mixup, no dropout or stochastic depth in fine-tuning.
- MAE fine-tuning: He et al., "Masked Autoencoders Are Scalable Vision Learners" (CVPR 2022), Table 9 and
  facebookresearch/mae FINETUNE.md for ViT-B: AdamW, base lr 5e-4 per 256 images, layer decay 0.65, weight decay
  0.05, 5 warmup epochs of 100, label smoothing 0.1, RandAugment (9, 0.5), mixup 0.8, cutmix 1.0, random erasing
  0.25, drop path 0.1 (83.6 top-1 on ImageNet-1k).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import HubViTError


class RecipeError(HubViTError):
    """A recipe name that is not one of RECIPES."""


@dataclass(frozen=True)
class Recipe:
    name: str
    source: str
    values: dict[str, Any] = field(default_factory=dict)
    lr_reference_batch: int | None = None


RECIPES = {
    "deit": Recipe(
        "deit",
        "DeiT (Touvron et al. 2021), Table 9; facebookresearch/deit main.py",
        {
            "optimizer": "adamw",
            "learning_rate": 5e-4,
            "weight_decay": 0.05,
            "lr_scheduler_type": "cosine",
            "warmup_ratio": 5 / 300,
            "label_smoothing": 0.1,
            "randaugment": 2,
            "randaugment_magnitude": 9,
            "mixup_alpha": 0.8,
            "cutmix_alpha": 1.0,
            "random_erasing": 0.25,
            "drop_path_rate": 0.1,
            "ema_decay": 0.99996,
            "max_grad_norm": 0.0,
        },
        lr_reference_batch=512,
    ),
    "augreg": Recipe(
        "augreg",
        "AugReg (Steiner et al. 2022), section 3.3 fine-tuning",
        {
            "optimizer": "sgd",
            "momentum": 0.9,
            "learning_rate": 0.03,
            "weight_decay": 0.0,
            "lr_scheduler_type": "cosine",
            "max_grad_norm": 1.0,
            "label_smoothing": 0.0,
            "mixup_alpha": 0.0,
            "cutmix_alpha": 0.0,
            "drop_path_rate": 0.0,
        },
    ),
    "mae": Recipe(
        "mae",
        "MAE fine-tuning (He et al. 2022), Table 9; facebookresearch/mae FINETUNE.md (ViT-B)",
        {
            "optimizer": "adamw",
            "learning_rate": 5e-4,
            "layer_decay": 0.65,
            "weight_decay": 0.05,
            "lr_scheduler_type": "cosine",
            "warmup_ratio": 5 / 100,
            "label_smoothing": 0.1,
            "randaugment": 2,
            "randaugment_magnitude": 9,
            "mixup_alpha": 0.8,
            "cutmix_alpha": 1.0,
            "random_erasing": 0.25,
            "drop_path_rate": 0.1,
            "max_grad_norm": 0.0,
        },
        lr_reference_batch=256,
    ),
}


def apply_recipe(args: Any, name: str | None, explicit: set[str], global_batch: int) -> dict[str, Any]:
    """Set the recipe's values on `args` for every flag not in `explicit` (the flags the user typed); returns what
    was set. The learning rate scales with `global_batch / lr_reference_batch` where the source says so."""
    if name is None:
        return {}
    if name not in RECIPES:
        raise RecipeError(f"--recipe {name!r} is not one of {', '.join(sorted(RECIPES))}")
    recipe = RECIPES[name]
    applied = {}
    for key, value in recipe.values.items():
        if key in explicit:
            continue
        if key == "learning_rate" and recipe.lr_reference_batch:
            value = value * global_batch / recipe.lr_reference_batch
        setattr(args, key, value)
        applied[key] = value
    return applied


def set_drop_path_rate(model: Any, rate: float) -> None:
    """Stochastic depth growing linearly from 0 (first block) to `rate` (last), as the model's own constructor does,
    on a model already built (from scratch or from a checkpoint)."""
    if not 0.0 <= rate < 1.0:
        raise RecipeError(f"--drop_path_rate must be in [0, 1), got {rate}")
    layers = model.hubvit.encoder.layers
    depth = len(layers)
    for i, layer in enumerate(layers):
        layer.drop_path_rate = rate * i / max(depth - 1, 1)
    model.config.drop_path_rate = rate


def with_random_erasing(train_transform: Any, probability: float) -> Any:
    """The training pipeline followed by torchvision's `v2.RandomErasing` on the normalised tensor, erased pixels
    drawn from a standard normal (timm's `--reprob` with `--remode pixel`)."""
    from torchvision.transforms import v2

    if not 0.0 <= probability <= 1.0:
        raise RecipeError(f"--random_erasing must be a probability in [0, 1], got {probability}")
    if probability == 0:
        return train_transform
    return v2.Compose([*train_transform.transforms, v2.RandomErasing(p=probability, value="random")])
