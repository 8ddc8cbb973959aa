"""The model that travels to the Hub: configuration and modeling files, flat, relative imports only."""

from .configuration_hubvit import HubViTConfig
from .modeling_hubvit import (
    HubViTBackbone,
    HubViTForImageClassification,
    HubViTForSemanticSegmentation,
    HubViTModel,
    HubViTPreTrainedModel,
)

__all__ = [
    "HubViTConfig",
    "HubViTModel",
    "HubViTForImageClassification",
    "HubViTBackbone",
    "HubViTForSemanticSegmentation",
    "HubViTPreTrainedModel",
]
