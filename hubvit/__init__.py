"""hubvit: a Vision Transformer for transformers that lives on the Hugging Face Hub.

Importing this package registers the classes with transformers' Auto classes, so an installed hubvit loads
hubvit folders without `trust_remote_code`. Every command of the `hubvit` CLI is also a function here
(`hubvit.convert_timm(src, out)`, `hubvit.export_onnx(...)`, `hubvit.info(...)`, ...), imported on first use so that
`import hubvit` does not pull in timm, ONNX, JAX or datasets. Its subpackages are the repository's top-level folders,
mapped by `package_dir` in setup.py (a source checkout needs `pip install -e .`).
"""

import importlib

from transformers import AutoBackbone, AutoConfig, AutoModel, AutoModelForImageClassification

from .modeling import HubViTBackbone, HubViTConfig, HubViTForImageClassification, HubViTModel, HubViTPreTrainedModel
from .cpu import optimize_for_cpu
from .errors import ConversionError, HubViTError, OutputExistsError

__version__ = "0.1.0"

AutoConfig.register(HubViTConfig.model_type, HubViTConfig, exist_ok=True)
AutoModel.register(HubViTConfig, HubViTModel, exist_ok=True)
AutoModelForImageClassification.register(HubViTConfig, HubViTForImageClassification, exist_ok=True)
AutoBackbone.register(HubViTConfig, HubViTBackbone, exist_ok=True)

_CONVERSION = "hubvit.conversion.api"
_ANALYSIS = "hubvit.analysis.commands"
_LAZY = {
    "convert_timm": _CONVERSION,
    "convert_jax": _CONVERSION,
    "convert_transformers": _CONVERSION,
    "convert_torchvision": _CONVERSION,
    "convert_pytorch": _CONVERSION,
    "export_onnx": _CONVERSION,
    "export_timm": _CONVERSION,
    "export_transformers": _CONVERSION,
    "push": _CONVERSION,
    "publish": _CONVERSION,
    "ConversionResult": _CONVERSION,
    "ExportResult": _CONVERSION,
    "PushResult": _CONVERSION,
    "PublishResult": _CONVERSION,
    "info": _ANALYSIS,
    "analyze_attention_distance": _ANALYSIS,
    "analyze_position_similarity": _ANALYSIS,
    "analyze_attention_map": _ANALYSIS,
    "InfoResult": _ANALYSIS,
    "AnalysisResult": _ANALYSIS,
    "train": "hubvit.training",
    "TrainingResult": "hubvit.training",
}


def __getattr__(name):
    """The command functions, imported from their module on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module 'hubvit' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "HubViTConfig",
    "HubViTModel",
    "HubViTForImageClassification",
    "HubViTBackbone",
    "HubViTPreTrainedModel",
    "optimize_for_cpu",
    "HubViTError",
    "ConversionError",
    "OutputExistsError",
    "__version__",
    *_LAZY,
]
