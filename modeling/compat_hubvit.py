"""What the installed transformers offers, and a local equivalent where a release lacks it (4.46 to newest).

A checkpoint freezes the modeling files, and its users run whatever transformers they have: every name below is
looked up once here and, where a release lacks it, replaced by code that computes the same numbers. The other
modeling files import these names and nothing version-dependent of their own.

This file travels to the Hub next to every checkpoint: flat, no I/O, imported relatively.
"""

import functools
import math
import warnings
from typing import Optional, TypedDict

import torch
import transformers
from torch import nn

try:
    from typing import Unpack
except ImportError:  # Python 3.10; typing_extensions comes with torch
    from typing_extensions import Unpack

try:
    from transformers.backbone_utils import BackboneMixin  # 5.25
except ImportError:  # 4.46 to 5.24 (5.25 still has this path, with a deprecation warning)
    from transformers.utils.backbone_utils import BackboneMixin

try:
    from transformers import initialization as init  # 5.0: initialisers that skip weights loaded from a checkpoint
except ImportError:  # 4.x initialises only the weights a checkpoint lacks, so torch's own functions do the same job
    init = nn.init

try:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # 4.48
except ImportError:
    ALL_ATTENTION_FUNCTIONS = None

try:
    from transformers.modeling_layers import GradientCheckpointingLayer  # 4.52
except ImportError:

    class GradientCheckpointingLayer(nn.Module):
        """What transformers' layer does: `gradient_checkpointing_enable()` sets the flag and the function."""

        gradient_checkpointing = False

        def __call__(self, *args, **kwargs):
            if self.gradient_checkpointing and self.training:
                return self._gradient_checkpointing_func(functools.partial(super().__call__, **kwargs), *args)
            return super().__call__(*args, **kwargs)


try:
    from transformers.utils import TransformersKwargs  # 4.54
except ImportError:

    class TransformersKwargs(TypedDict, total=False):
        output_hidden_states: Optional[bool]
        output_attentions: Optional[bool]
        num_items_in_batch: Optional[torch.Tensor]


def wants_tuple(model, kwargs):
    """Pops `return_dict`; True when the caller (or the config) asked for a plain tuple."""
    return_dict = kwargs.pop("return_dict", None)
    if return_dict is None:
        return_dict = getattr(model.config, "return_dict", True)
    return not return_dict


try:
    from transformers.utils.generic import can_return_tuple  # 4.50
except ImportError:

    def can_return_tuple(forward):
        @functools.wraps(forward)
        def wrapper(self, *args, **kwargs):
            as_tuple = wants_tuple(self, kwargs)
            outputs = forward(self, *args, **kwargs)
            return outputs.to_tuple() if as_tuple else outputs

        return wrapper


try:
    from transformers.utils.output_capturing import capture_outputs  # 5.2
except ImportError:
    capture_outputs = None
try:
    from transformers.utils.output_capturing import selected_hidden_states as _selection_support  # noqa: F401

    SELECTS_HIDDEN_STATES = capture_outputs is not None
except ImportError:
    SELECTS_HIDDEN_STATES = False

MISSING = [
    feature
    for feature, present in (
        (
            "the attention-function registry (only eager and sdpa attention run; no flash, flex or paged attention)",
            ALL_ATTENTION_FUNCTIONS is not None,
        ),
    )
    if not present
]
if MISSING:
    warnings.warn(
        f"HubViT on transformers {transformers.__version__} lacks {'; '.join(MISSING)}: outputs are the same, "
        "upgrade transformers for the rest",
        stacklevel=2,
    )


def lecun_normal_(tensor):
    """LeCun normal (truncated at 2 std, as JAX's): `initialization.lecun_normal_` where the release has it."""
    if hasattr(init, "lecun_normal_"):
        return init.lecun_normal_(tensor)
    fan_in = nn.init._calculate_fan_in_and_fan_out(tensor)[0]
    return init.trunc_normal_(tensor, std=math.sqrt(1.0 / fan_in) / 0.87962566103423978)


def select_hidden_states(states, selection):
    """transformers 5's selection of hidden states by index (negative ones count from the end): the chosen entries
    kept, the others None; `selection` True (or None) keeps them all. The one place every output path selects."""
    states = tuple(states)
    if selection is None or isinstance(selection, bool):
        return states
    chosen = [selection] if isinstance(selection, int) else list(selection)
    keep = {i % len(states) for i in chosen if -len(states) <= i < len(states)}
    return tuple(state if i in keep else None for i, state in enumerate(states))


def record_outputs(forward):
    """Output capturing for every release: transformers' `capture_outputs` where it exists, else forward hooks on the
    modules the model's `_can_record_outputs` names, with the same results. `output_hidden_states` may select
    entries by index (`select_hidden_states`)."""
    captured = capture_outputs(tie_last_hidden_states=False)(forward) if capture_outputs is not None else None

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        hidden = kwargs.get("output_hidden_states", getattr(self.config, "output_hidden_states", False))
        selection = None if isinstance(hidden, bool) or hidden is None else hidden
        if captured is not None and (SELECTS_HIDDEN_STATES or selection is None):
            return captured(self, *args, **kwargs)
        if selection is not None:
            kwargs["output_hidden_states"] = True
        if captured is not None:
            as_tuple = wants_tuple(self, kwargs)
            outputs = captured(self, *args, **kwargs, return_dict=True)
        else:
            outputs, as_tuple = record_with_hooks(self, forward, args, kwargs)
        if selection is not None:
            outputs["hidden_states"] = select_hidden_states(outputs.hidden_states, selection)
        return outputs.to_tuple() if as_tuple else outputs

    return wrapper


def record_with_hooks(model, forward, args, kwargs):
    """The encoder input and every block's output (`hidden_states`), every attention's weights (`attentions`), from
    the block and attention classes `_can_record_outputs` names."""
    as_tuple = wants_tuple(model, kwargs)
    config = model.config
    want_hidden = bool(kwargs.get("output_hidden_states", getattr(config, "output_hidden_states", False)))
    want_attentions = bool(kwargs.get("output_attentions", getattr(config, "output_attentions", False)))
    recorded = model._can_record_outputs
    hidden, attentions, handles = [], [], []
    layers = [module for module in model.modules() if isinstance(module, recorded["hidden_states"])]
    if want_hidden:
        handles.append(layers[0].register_forward_pre_hook(lambda module, inputs: hidden.append(inputs[0])))
        handles += [layer.register_forward_hook(lambda module, inputs, out: hidden.append(out)) for layer in layers]
    if want_attentions:
        handles += [
            module.register_forward_hook(lambda module, inputs, out: attentions.append(out[1]))
            for module in model.modules()
            if isinstance(module, recorded["attentions"])
        ]
    try:
        outputs = forward(model, *args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    if want_hidden:
        outputs["hidden_states"] = tuple(hidden)
    if want_attentions:
        outputs["attentions"] = tuple(attentions)
    return outputs, as_tuple


def check_kwargs(kwargs, model):
    """A misspelt keyword is an error, as it is for any Python function; transformers' own keywords pass through."""
    unknown = sorted(set(kwargs) - set(TransformersKwargs.__annotations__))
    if unknown:
        raise TypeError(f"{type(model).__name__}.forward() got unexpected keyword arguments {unknown}")


def register_with_optimum():
    """Under `optimum-cli export onnx --trust-remote-code` (optimum's exporter already imported, nothing imported
    here otherwise), tell optimum's task manager how to export hubvit: as its ViT, inputs and outputs alike."""
    import sys

    if "optimum.exporters.tasks" not in sys.modules:
        return
    try:
        from optimum.exporters.onnx.model_configs import ViTOnnxConfig
        from optimum.exporters.tasks import TasksManager
    except ImportError:
        return

    @TasksManager.create_register("onnx", overwrite_existing=True)(
        "hubvit", "feature-extraction", "image-classification"
    )
    class HubViTOnnxConfig(ViTOnnxConfig):
        DEFAULT_ONNX_OPSET = 18


register_with_optimum()

__all__ = [
    "ALL_ATTENTION_FUNCTIONS",
    "BackboneMixin",
    "GradientCheckpointingLayer",
    "TransformersKwargs",
    "Unpack",
    "can_return_tuple",
    "check_kwargs",
    "init",
    "lecun_normal_",
    "record_outputs",
    "select_hidden_states",
]
