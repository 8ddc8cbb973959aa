"""The model a config describes, built on the meta device: what `hubvit info` and the size budget count."""

import torch

from .modeling import HubViTForImageClassification, HubViTModel


def meta_model(config, head=True):
    """The model `config` describes, built on the meta device: its real modules and shapes, with no memory and no
    weights to initialise, so a ViT-H counts as fast as a ViT-Ti. Eager attention, whose two products FlopCounterMode
    sees as matrix products. `head=False`: the body alone (`HubViTModel`)."""
    with torch.device("meta"):
        return (HubViTForImageClassification if head else HubViTModel)._from_config(config, attn_implementation="eager")
