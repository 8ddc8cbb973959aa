"""`optimize_for_cpu`: the opt-in CPU speed route for an installed hubvit model.

The model that travels to the Hub multiplies with `nn.Linear`, which torch sends to the BLAS sgemm (MKL). Which of
MKL and oneDNN is faster depends on the CPU: on AMD Zen 5 (AVX-512) oneDNN runs the encoder's float32 products at
about twice the sgemm's FLOP/s, on AMD Zen 3 (AVX2) both run AVX2 kernels and MKL is as fast or faster
(`python benchmarks/projections.py`). So no rule is written down here: each encoder projection becomes a
`FastestLinear`, which times both kernels on its own product shape the first time it meets it (forward, and each
of the two backward products), remembers the winner for the process, and keeps MKL unless oneDNN is measurably
faster. In training that is not the whole cost: the oneDNN route runs the layer's backward in Python, with copies
of transposed operands, and timing products alone picked it where the step then ran 0.95x the default (AMD Zen 4).
So a layer that trains is decided by timing what runs: its forward and backward together, PyTorch's own against
the chosen kernels. The parameters (the state dict, and so every saved file) are unchanged.

`precision="int8"` quantizes the encoder's projections (weights int8, activations quantized on the fly) and keeps
the patch embedding, LayerNorms, pooler and head in float; `precision="bf16"` runs the encoder under bfloat16
autocast where the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX), and is refused elsewhere.
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .errors import HubViTError

logger = logging.getLogger(__name__)

__all__ = ["FastestLinear", "KernelChooser", "cpu_isa", "has_native_bf16", "optimize_for_cpu", "PRECISIONS"]

PRECISIONS = ("float32", "int8", "bf16")
KERNELS = ("mkl", "onednn")
DIRECTIONS = ("forward", "input-gradient", "weight-gradient")


def onednn_linear(input, weight, bias):
    return torch.ops.mkldnn._linear_pointwise(input, weight, bias, "none", [], "")


def blas_linear(input, weight, bias):
    return F.linear(input, weight, bias)


LINEAR = {"mkl": blas_linear, "onednn": onednn_linear}


def onednn_usable() -> bool:
    return torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled


def time_product(kernel: str, rows: int, inner: int, outer: int, repeats: int = 3) -> float:
    """Median seconds of one (rows x inner) @ (inner x outer) float32 product through `kernel`, after one warm-up."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, inner, generator=generator)
    w = torch.randn(outer, inner, generator=generator) * 0.02
    multiply = LINEAR[kernel]
    times = []
    with torch.no_grad():
        multiply(x, w, None)
        for _ in range(repeats):
            start = time.perf_counter()
            multiply(x, w, None)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


Measure = Callable[[str, int, int, int], float]
MeasureLayer = Callable[[str, tuple, int, int, tuple, "KernelChooser"], float]
ROUTES = ("pytorch", "chosen")


def time_layer(route, input_shape, fan_in, fan_out, needs, chooser, repeats=3):
    """Median seconds of one forward and backward of a float32 linear layer on an input of `input_shape`, with
    gradients for (input, weight, bias) as `needs` says (None: no bias): `route` "pytorch" is `F.linear` with PyTorch's backward
    (the default model's), "chosen" the `_FastestLinearFunction` on the kernels `chooser` picks per product, with
    its Python backward and operand copies."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*input_shape, generator=generator).requires_grad_(needs[0])
    weight = (torch.randn(fan_out, fan_in, generator=generator) * 0.02).requires_grad_(needs[1])
    bias = None if needs[2] is None else torch.zeros(fan_out).requires_grad_(needs[2])
    grad_output = torch.randn(*input_shape[:-1], fan_out, generator=generator)
    inputs = [t for t in (x, weight, bias) if t is not None and t.requires_grad]
    times = []
    with torch.enable_grad():
        for index in range(repeats + 1):
            start = time.perf_counter()
            if route == "pytorch":
                output = F.linear(x, weight, bias)
            else:
                output = _FastestLinearFunction.apply(x, weight, bias, chooser)
            torch.autograd.grad(output, inputs, grad_output)
            if index:
                times.append(time.perf_counter() - start)
    return statistics.median(times)


class KernelChooser:
    """Which kernel multiplies a (rows x inner) @ (inner x outer) float32 product faster on this machine.

    The first request for a shape (and thread count) times both kernels with `measure(kernel, rows, inner, outer)`
    (seconds; interleaved over `rounds`, median), and every later one reads the cached answer. oneDNN is chosen
    only when it beats MKL by more than `margin` (a fraction), so a tie or a noisy probe keeps the default kernel
    and the opt-in cannot end up slower than the model it was applied to.
    """

    def __init__(
        self,
        measure: Measure | None = None,
        rounds: int = 3,
        margin: float = 0.05,
        measure_layer: MeasureLayer | None = None,
    ):
        self.measure = measure or time_product
        self.measure_layer = measure_layer or time_layer
        self.rounds = rounds
        self.margin = margin
        self.choices: dict[tuple, str] = {}
        self.timings: dict[tuple, dict[str, float]] = {}
        self.layer_choices: dict[tuple, str] = {}
        self.layer_timings: dict[tuple, dict[str, float]] = {}

    def _faster(self, candidates, measure, timings):
        """The second candidate if it beats the first by more than the margin (interleaved rounds, medians)."""
        times = {candidate: [] for candidate in candidates}
        for index in range(self.rounds):
            for candidate in candidates if index % 2 == 0 else candidates[::-1]:
                times[candidate].append(measure(candidate))
        medians = {candidate: statistics.median(values) for candidate, values in times.items()}
        timings.update(medians)
        default, other = candidates
        return other if medians[other] * (1 + self.margin) < medians[default] else default

    def choose_training(self, input_shape: tuple, fan_in: int, fan_out: int, needs: tuple) -> str:
        """ "chosen" when a layer's forward and backward on the per-product kernels beat PyTorch's own (F.linear and
        its backward) by more than the margin, timed together on this input shape; else "pytorch". Only asked for
        layers where some product chose oneDNN."""
        key = (tuple(input_shape), fan_in, fan_out, tuple(needs), torch.get_num_threads())
        choice = self.layer_choices.get(key)
        if choice is None:
            measure = lambda route: self.measure_layer(route, input_shape, fan_in, fan_out, needs, self)  # noqa: E731
            choice = self._faster(ROUTES, measure, self.layer_timings.setdefault(key, {}))
            self.layer_choices[key] = choice
        return choice

    def choose(self, rows: int, inner: int, outer: int) -> str:
        key = (rows, inner, outer, torch.get_num_threads())
        choice = self.choices.get(key)
        if choice is None:
            if not onednn_usable():
                choice = "mkl"
            else:
                measure = lambda kernel: self.measure(kernel, rows, inner, outer)  # noqa: E731
                choice = self._faster(KERNELS, measure, self.timings.setdefault(key, {}))
            self.choices[key] = choice
        return choice

    def clear(self):
        for table in (self.choices, self.timings, self.layer_choices, self.layer_timings):
            table.clear()


CHOOSER = KernelChooser()


def product_shape(direction: str, tokens: int, fan_in: int, fan_out: int) -> tuple[int, int, int]:
    """(rows, inner, outer) of one of a linear layer's three products over `tokens` rows."""
    if direction == "forward":
        return tokens, fan_in, fan_out
    if direction == "input-gradient":
        return tokens, fan_out, fan_in
    if direction == "weight-gradient":
        return fan_out, tokens, fan_in
    raise HubViTError(f"direction={direction!r}: expected one of {DIRECTIONS}")


def operand(kernel, tensor):
    """A transposed view as `kernel` takes it: MKL reads the strides, oneDNN wants the rows laid out (a copy)."""
    return tensor.contiguous() if kernel == "onednn" else tensor


def all_mkl(chooser, tokens, fan_in, fan_out):
    """Whether the probe keeps MKL for all three products of a layer over `tokens` rows."""
    return all(chooser.choose(*product_shape(d, tokens, fan_in, fan_out)) == "mkl" for d in DIRECTIONS)


class _FastestLinearFunction(torch.autograd.Function):
    """y = x W^T + b with each of the three products (forward, dL/dx, dL/dW) on the kernel chosen for its shape."""

    @staticmethod
    def forward(ctx, input, weight, bias, chooser):
        ctx.save_for_backward(input, weight)
        ctx.has_bias = bias is not None
        ctx.chooser = chooser
        tokens = input.numel() // input.shape[-1]
        kernel = chooser.choose(*product_shape("forward", tokens, weight.shape[1], weight.shape[0]))
        return LINEAR[kernel](input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        chooser = ctx.chooser
        fan_out, fan_in = weight.shape
        grad_2d = grad_output.reshape(-1, fan_out)
        tokens = grad_2d.shape[0]
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            kernel = chooser.choose(*product_shape("input-gradient", tokens, fan_in, fan_out))
            grad_input = LINEAR[kernel](grad_output, operand(kernel, weight.t()), None)
        if ctx.needs_input_grad[1]:
            kernel = chooser.choose(*product_shape("weight-gradient", tokens, fan_in, fan_out))
            input_2d = input.reshape(-1, fan_in)
            grad_weight = LINEAR[kernel](operand(kernel, grad_2d.t()), operand(kernel, input_2d.t()), None)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_2d.sum(0)
        return grad_input, grad_weight, grad_bias, None


class FastestLinear(nn.Linear):
    """`nn.Linear` whose float32 CPU products each run on the kernel (MKL or oneDNN) measured fastest for their shape.

    Anything else (other devices or dtypes, empty inputs, a graph being compiled or traced) takes `F.linear`, so
    the module stays an `nn.Linear` for every tool that expects one.
    """

    chooser: KernelChooser = CHOOSER

    def forward(self, input):
        if (
            input.device.type != "cpu"
            or input.dtype != torch.float32
            or self.weight.dtype != torch.float32
            or input.numel() == 0
            or torch.compiler.is_compiling()
            or torch.jit.is_tracing()
        ):
            return F.linear(input, self.weight, self.bias)
        tokens = input.numel() // input.shape[-1]
        needs = tuple(None if t is None else t.requires_grad for t in (input, self.weight, self.bias))
        if torch.is_grad_enabled() and any(needs):
            if all_mkl(self.chooser, tokens, self.in_features, self.out_features) or (
                self.chooser.choose_training(tuple(input.shape), self.in_features, self.out_features, needs)
                == "pytorch"
            ):
                return F.linear(input, self.weight, self.bias)  # PyTorch's own backward: no Python in the step
            return _FastestLinearFunction.apply(input, self.weight, self.bias, self.chooser)
        kernel = self.chooser.choose(*product_shape("forward", tokens, self.in_features, self.out_features))
        return LINEAR[kernel](input, self.weight, self.bias)


BF16_ROUTES = ("float32", "bf16")


def time_encoder_routes(run: Callable[[str], object], rounds: int = 3) -> dict[str, float]:
    """Median seconds of `run(route)` for each of `BF16_ROUTES`: one warm-up each (bfloat16's first call packs its
    weights), then interleaved rounds."""
    for route in BF16_ROUTES:
        run(route)
    times = {route: [] for route in BF16_ROUTES}
    for _ in range(rounds):
        for route in BF16_ROUTES:
            start = time.perf_counter()
            run(route)
            times[route].append(time.perf_counter() - start)
    return {route: statistics.median(values) for route, values in times.items()}


class BFloat16Probe:
    """Whether the encoder runs faster under bfloat16 autocast than in float32 on this CPU, per input shape and
    thread count, measured at the first forward of that shape (`measure(run)`: seconds per route). bfloat16 is kept
    only where it beats float32 by more than `margin`: native bfloat16 is not always faster (a 2-core Xeon with
    AVX512-BF16 and no AMX ran ViT-S/16 at 0.60x float32; a Zen 5 EPYC at 2.8x), so the opt-in never runs slower
    than the float32 it replaces."""

    def __init__(self, measure: Callable | None = None, margin: float = 0.05):
        self.measure = measure or time_encoder_routes
        self.margin = margin
        self.choices: dict[tuple, str] = {}

    def route(self, key: tuple, run: Callable[[str], object]) -> str:
        if key not in self.choices:
            timings = self.measure(run)
            faster = timings["bf16"] * (1 + self.margin) < timings["float32"]
            self.choices[key] = "bf16" if faster else "float32"
            if not faster:
                logger.info(
                    "precision='bf16': the encoder at input %s took %.1f ms in bfloat16 against %.1f ms in float32 on "
                    "this CPU (%s); keeping float32",
                    key[0],
                    1000 * timings["bf16"],
                    1000 * timings["float32"],
                    cpu_isa(),
                )
        return self.choices[key]


class BFloat16Encoder:
    """Mixin for the encoder's class: its forward under CPU bfloat16 autocast where that is faster on this CPU
    (`BFloat16Probe`, measured at the first forward of each input shape), the result cast back to the input's dtype.
    Autocast runs the projections, the attention products and the MLP in bfloat16 and keeps what it lists as
    float32-sensitive (softmax, norms) in float32; the residual stream stays float32, as do the patch embedding,
    pooler and head outside the encoder. Converting only the projections (the first version of this route) ran
    ViT-S/16 at 58.6 img/s on an AMX Xeon against 101.5 with the attention in bfloat16 too. A forward that records
    block outputs or attention weights is not timed (the probe would record each run): it takes the route measured
    for its shape, or bfloat16 before any; so does a traced or compiled one."""

    def forward(self, hidden_states, grid, num_output_tokens=None, last_block=None, states=None, **kwargs):
        def run(route):
            encoder = super(BFloat16Encoder, self).forward
            if route == "float32":
                return encoder(hidden_states, grid, num_output_tokens, last_block, states, **kwargs)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                output = encoder(hidden_states, grid, num_output_tokens, last_block, states, **kwargs)
            return output.to(hidden_states.dtype)

        key = (tuple(hidden_states.shape), hidden_states.dtype, torch.get_num_threads())
        probe = self.bfloat16_probe
        recording = states is not None or kwargs.get("output_attentions")
        if recording or torch.jit.is_tracing() or torch.compiler.is_compiling():
            return run(probe.choices.get(key, "bf16"))
        if key not in probe.choices:
            with torch.no_grad():
                probe.route(key, run)
        return run(probe.choices[key])


@functools.cache
def bfloat16_class(cls: type) -> type:
    return type(f"BFloat16{cls.__name__}", (BFloat16Encoder, cls), {})


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags the kernel reports (x86 `flags`, Arm `Features`); empty where it reports none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's name as the kernel reports it (x86 `model name`, with its family and model numbers where the name
    is generic), else the platform's processor string: what a run record names beside the ISA."""
    import platform

    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name


def cpu_isa(flags: frozenset[str] | None = None) -> str:
    """The widest vector ISA of this CPU that matters for ViT's products: AMX, AVX512-BF16, AVX-512, AVX2 or other."""
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "AVX512-BF16"
    if "avx512f" in flags:
        return "AVX-512"
    if "avx2" in flags:
        return "AVX2"
    if "bf16" in flags:
        return "Arm BF16"
    return torch.backends.cpu.get_cpu_capability()


def has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU multiplies bfloat16 in hardware (x86 AVX512-BF16 or AMX, Arm BF16)."""
    flags = cpu_flags() if flags is None else flags
    return bool({"avx512_bf16", "amx_bf16", "bf16"} & flags)


def _skip_unread_tokens(module, args, kwargs):
    """Forward pre-hook: the last block computes only the tokens the head reads, unless the caller asked for more."""
    wants_outputs = any(
        kwargs.get(key) or (kwargs.get(key) is None and getattr(module.config, key, False))
        for key in ("output_hidden_states", "output_attentions")
    )
    if kwargs.get("num_output_tokens") is None and not wants_outputs:
        kwargs["num_output_tokens"] = module.hubvit.pooler.num_tokens_read
    return args, kwargs


def encoder_projections(model) -> dict[str, nn.Linear]:
    """Qualified name -> module of every plain `nn.Linear` in the encoder (qkv, attention output, MLP in and out)."""
    body = getattr(model, "hubvit", model)
    prefix = "hubvit.encoder." if body is not model else "encoder."
    return {prefix + name: module for name, module in body.encoder.named_modules() if type(module) is nn.Linear}


def quantize_int8(model) -> None:
    """Encoder projections to int8 weights with dynamic per-batch int8 activations, in place (PyTorch's engine).

    torchao's `Int8DynamicActivationInt8WeightConfig` is the maintained API, but with torch 2.14 / torchao 0.18 it
    has no eager CPU kernel (ViT-S/16 ran 0.06 img/s against 0.8 in float32); PyTorch's quantized engine (fbgemm /
    oneDNN, `quantize_dynamic`) runs int8 GEMMs. Its two deprecation notices (the module, and the quantized tensor
    constructors it calls) are about that migration, so only those two are silenced.
    """
    from torch.ao.quantization import quantize_dynamic

    names = set(encoder_projections(model))
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"(?s).*torch\.ao\.quantization.*deprecated", category=DeprecationWarning
        )
        warnings.filterwarnings("ignore", message=r"(?s).*please migrate to use torchao", category=UserWarning)
        warnings.filterwarnings(
            "ignore", message=r"torch\.quantize_per_tensor, .* are deprecated", category=UserWarning
        )
        quantize_dynamic(model, qconfig_spec=names, dtype=torch.qint8, inplace=True)


def optimize_for_cpu(model, skip_unread_tokens: bool = True, precision: str = "float32"):
    """Make a hubvit model faster on CPU, in place; returns it.

    `precision="float32"` (default): every `nn.Linear` inside the encoder becomes a `FastestLinear` sharing its
    parameters, so outputs equal the default's to float32 rounding, gradients flow, and `state_dict` /
    `save_pretrained` write exactly what they wrote before; each product runs on the kernel its first-use probe
    found faster (MKL unless oneDNN wins by more than 5%); a layer that trains takes those kernels only where its
    forward and backward, timed together, beat PyTorch's own by more than 5%. With `skip_unread_tokens` a
    classifier whose head reads the [CLS] (and distillation) token runs its last block for those tokens only,
    unless hidden states or attentions are asked for; a hook on the last block or the final norm then sees those
    tokens alone, so pass False for explainability tools that hook them.

    `precision="int8"`: inference only (the model is put in eval mode); encoder projections int8 with dynamic
    activation quantization, patch embedding, LayerNorms, pooler and head in float. The state dict changes (packed
    int8 weights): save the float model, not this one. `precision="bf16"`: inference only, the encoder under bfloat16
    autocast (products in bfloat16, residual stream, norms and softmax in float32), on CPUs with native bfloat16
    (AVX512-BF16, AMX); refused with `HubViTError` on others. The first forward at each input shape times bfloat16
    against float32 (eight encoder passes) and keeps float32, logged, where bfloat16 is not faster
    (`BFloat16Probe`). The state dict is unchanged.
    """
    body = getattr(model, "hubvit", model)
    encoder = getattr(body, "encoder", None)
    if encoder is None or not hasattr(body, "pooler"):
        raise HubViTError(
            f"optimize_for_cpu expects a HubViTModel or HubViTForImageClassification, got {type(model).__name__}"
        )
    if precision not in PRECISIONS:
        raise HubViTError(f"precision={precision!r}: expected one of {PRECISIONS}")
    if precision == "bf16" and not has_native_bf16():
        raise HubViTError(
            f"precision='bf16' needs a CPU with native bfloat16 (AVX512-BF16 or AMX); this one has {cpu_isa()}: "
            "use precision='int8' or 'float32'"
        )
    if precision == "int8":
        model.eval()
        quantize_int8(model)
    elif precision == "bf16":
        model.eval()
        if not isinstance(encoder, BFloat16Encoder):
            encoder.__class__ = bfloat16_class(type(encoder))
            encoder.bfloat16_probe = BFloat16Probe()
    else:
        for module in encoder_projections(model).values():
            module.__class__ = FastestLinear
    if skip_unread_tokens and body is not model and body.pooler.num_tokens_read is not None:
        if not getattr(model, "_hubvit_skips_unread_tokens", False):
            model.register_forward_pre_hook(_skip_unread_tokens, with_kwargs=True)
            model._hubvit_skips_unread_tokens = True
    return model
