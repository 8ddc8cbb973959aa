"""`optimize_for_cpu`: the opt-in CPU speed route for an installed hubvit model.

The model that travels to the Hub multiplies with `nn.Linear`, which torch sends to the BLAS sgemm (MKL). On the
AMD Zen CPUs we measure on, oneDNN's AVX-512 kernels run the encoder's float32 products at about twice the sgemm's
FLOP/s (`python benchmarks/projections.py`), so this module swaps each encoder projection for a `OneDNNLinear`: the
same parameters (the state dict, and so every saved file, is unchanged) and the same function, computed by oneDNN.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["OneDNNLinear", "optimize_for_cpu"]


def onednn_linear(input, weight, bias):
    return torch.ops.mkldnn._linear_pointwise(input, weight, bias, "none", [], "")


class _OneDNNLinearFunction(torch.autograd.Function):
    """y = x W^T + b through oneDNN, with both backward products through oneDNN too."""

    @staticmethod
    def forward(ctx, input, weight, bias):
        ctx.save_for_backward(input, weight)
        ctx.has_bias = bias is not None
        return onednn_linear(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = onednn_linear(grad_output, weight.t().contiguous(), None)
        grad_2d = grad_output.reshape(-1, grad_output.shape[-1])
        if ctx.needs_input_grad[1]:
            input_2d = input.reshape(-1, input.shape[-1])
            grad_weight = onednn_linear(grad_2d.t().contiguous(), input_2d.t().contiguous(), None)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_2d.sum(0)
        return grad_input, grad_weight, grad_bias


class OneDNNLinear(nn.Linear):
    """`nn.Linear` whose float32 CPU products run through oneDNN (`mkldnn._linear_pointwise`), forward and backward.

    Anything else (other devices or dtypes, empty inputs, a build without oneDNN, a graph being compiled or
    exported) takes `F.linear`, so the module stays an `nn.Linear` for every tool that expects one.
    """

    def forward(self, input):
        if (
            input.device.type != "cpu"
            or input.dtype != torch.float32
            or self.weight.dtype != torch.float32
            or input.numel() == 0
            or not torch.backends.mkldnn.is_available()
            or not torch.backends.mkldnn.enabled
            or torch.compiler.is_compiling()
            or torch.jit.is_tracing()
        ):
            return F.linear(input, self.weight, self.bias)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (input, self.weight, self.bias)):
            return _OneDNNLinearFunction.apply(input, self.weight, self.bias)
        return onednn_linear(input, self.weight, self.bias)


def _skip_unread_tokens(module, args, kwargs):
    """Forward pre-hook: the last block computes only the tokens the head reads, unless the caller asked for more."""
    wants_outputs = any(
        kwargs.get(key) or (kwargs.get(key) is None and getattr(module.config, key, False))
        for key in ("output_hidden_states", "output_attentions")
    )
    if kwargs.get("num_output_tokens") is None and not wants_outputs:
        kwargs["num_output_tokens"] = module.hubvit.pooler.num_tokens_read
    return args, kwargs


def optimize_for_cpu(model, skip_unread_tokens=True):
    """Make a hubvit model faster on CPU in float32, in place; returns it.

    Every `nn.Linear` inside `model.hubvit.encoder` (or `model.encoder`) becomes a `OneDNNLinear` sharing its
    parameters: outputs equal the default's to float32 rounding, gradients flow, and `state_dict`/`save_pretrained`
    write exactly what they wrote before. With `skip_unread_tokens` a classifier whose head reads the [CLS] (and
    distillation) token runs its last block for those tokens only, unless hidden states or attentions are asked
    for; a forward hook on the last block or the final norm then sees those tokens alone, so pass False for
    explainability tools that hook them. `quantize_dynamic` matches exact types and leaves `OneDNNLinear` alone:
    quantize the default model instead.
    """
    body = getattr(model, "hubvit", model)
    encoder = getattr(body, "encoder", None)
    if encoder is None or not hasattr(body, "pooler"):
        raise TypeError(f"optimize_for_cpu expects a HubViTModel or HubViTForImageClassification, got {type(model).__name__}")
    for module in encoder.modules():
        if type(module) is nn.Linear:
            module.__class__ = OneDNNLinear
    if skip_unread_tokens and body is not model and body.pooler.num_tokens_read is not None:
        if not getattr(model, "_hubvit_skips_unread_tokens", False):
            model.register_forward_pre_hook(_skip_unread_tokens, with_kwargs=True)
            model._hubvit_skips_unread_tokens = True
    return model
