"""hubvit: a Vision Transformer for transformers that lives on the Hugging Face Hub.

Importing this package registers the classes with transformers' Auto classes, so an installed hubvit loads
hubvit folders without `trust_remote_code`. Its subpackages are the repository's top-level folders, mapped by
`package_dir` in setup.py (a source checkout needs `pip install -e .`).
"""

from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

from .modeling import HubViTConfig, HubViTForImageClassification, HubViTModel, HubViTPreTrainedModel
from .cpu import optimize_for_cpu
from .errors import HubViTError

__version__ = "0.1.0"

AutoConfig.register(HubViTConfig.model_type, HubViTConfig, exist_ok=True)
AutoModel.register(HubViTConfig, HubViTModel, exist_ok=True)
AutoModelForImageClassification.register(HubViTConfig, HubViTForImageClassification, exist_ok=True)

__all__ = ["HubViTConfig", "HubViTModel", "HubViTForImageClassification", "HubViTPreTrainedModel", "optimize_for_cpu", "HubViTError", "train", "__version__"]

LAZY = {"train": "hubvit.training"}  # imported on first use, so `import hubvit` does not load datasets


def __getattr__(name):
    if name in LAZY:
        import importlib

        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'hubvit' has no attribute {name!r}")
