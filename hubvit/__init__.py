"""hubvit: a Vision Transformer for transformers that lives on the Hugging Face Hub.

Importing this package registers the classes with transformers' Auto classes, so an installed hubvit loads
hubvit folders without `trust_remote_code`. Every command of the `hubvit` CLI is also a function here
(`hubvit.convert_timm(src, out)`, `hubvit.export_onnx(...)`, `hubvit.info(...)`, ...), derived from the command
table (`hubvit.commands`) and imported on first use so that `import hubvit` does not pull in timm, ONNX, JAX or
datasets. Its subpackages are the repository's top-level folders, mapped by `package_dir` in setup.py (a source
checkout needs `pip install -e .`).
"""

import importlib

from transformers import (
    AutoBackbone,
    AutoConfig,
    AutoModel,
    AutoModelForImageClassification,
    AutoModelForSemanticSegmentation,
)

from . import commands as _commands
from .modeling import (
    HubViTBackbone,
    HubViTConfig,
    HubViTForImageClassification,
    HubViTForSemanticSegmentation,
    HubViTModel,
    HubViTPreTrainedModel,
)
from .cpu import optimize_for_cpu
from .errors import ConversionError, HubViTError, OutputExistsError

__version__ = "0.1.0"

AutoConfig.register(HubViTConfig.model_type, HubViTConfig, exist_ok=True)
AutoModel.register(HubViTConfig, HubViTModel, exist_ok=True)
AutoModelForImageClassification.register(HubViTConfig, HubViTForImageClassification, exist_ok=True)
AutoBackbone.register(HubViTConfig, HubViTBackbone, exist_ok=True)
AutoModelForSemanticSegmentation.register(HubViTConfig, HubViTForSemanticSegmentation, exist_ok=True)

_LAZY = _commands.lazy_names()


def __getattr__(name):
    """The command functions (derived from the command table) and their records, imported on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module 'hubvit' has no attribute {name!r}")
    module = _LAZY[name]
    value = _commands.function(name) if module is None else getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "HubViTConfig",
    "HubViTModel",
    "HubViTForImageClassification",
    "HubViTBackbone",
    "HubViTForSemanticSegmentation",
    "HubViTPreTrainedModel",
    "optimize_for_cpu",
    "HubViTError",
    "ConversionError",
    "OutputExistsError",
    "__version__",
    *_LAZY,
]
