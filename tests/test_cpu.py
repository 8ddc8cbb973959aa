"""`hubvit.optimize_for_cpu`: the same function, parameters and files as the default model, each product on the
kernel measured fastest for its shape; and its int8 and bf16 routes.

Tolerances: oneDNN sums the products in another order than the BLAS sgemm, so float32 outputs (and gradients)
agree to float32 rounding accumulated over two tiny blocks: 1e-5 relative to the output scale. The kernel choice is
tested with injected timings (a test never times anything). int8 is held to the issue's bound on a model this file
trains on scikit-learn's digits: top-1 agreement with float32 at least 99% and held-out accuracy within one point.
"""

import copy
import hashlib
import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from transformers import AutoModelForImageClassification

import hubvit
from hubvit import HubViTForImageClassification, HubViTModel, optimize_for_cpu
import hubvit.cpu as cpu
from hubvit import HubViTError
from hubvit.cpu import FastestLinear, KernelChooser, product_shape
from utils import assert_close, randomize_, tiny_config


needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def make(cls=HubViTForImageClassification, **overrides):
    torch.manual_seed(0)
    return randomize_(cls(tiny_config(num_labels=5, **overrides))).eval()


def pixels(height=32, width=32, batch=2):
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(1))


def pair(**overrides):
    default = make(**overrides)
    return default, optimize_for_cpu(copy.deepcopy(default))


def test_is_exported_from_the_package():
    assert hubvit.optimize_for_cpu is optimize_for_cpu


def test_every_encoder_projection_becomes_a_fastest_linear_that_is_still_an_nn_linear():
    model = optimize_for_cpu(make())
    linears = [m for m in model.hubvit.encoder.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 4 * model.config.num_hidden_layers
    assert all(type(m) is FastestLinear for m in linears)
    assert type(model.classifier) is nn.Linear


def fake_timings(seconds):
    """A `measure` that answers from a table {(kernel, rows, inner, outer): seconds} and logs every call."""
    calls = []

    def measure(kernel, rows, inner, outer):
        calls.append((kernel, rows, inner, outer))
        return seconds[(kernel, rows, inner, outer)]

    return measure, calls


@pytest.fixture
def with_onednn(monkeypatch):
    monkeypatch.setattr(cpu, "onednn_usable", lambda: True)


@pytest.mark.parametrize(
    "mkl, onednn, expected",
    [(2.0, 1.0, "onednn"), (1.0, 2.0, "mkl"), (1.0, 0.97, "mkl"), (1.0, 1.0, "mkl"), (1.0, 0.94, "onednn")],
)
def test_onednn_is_chosen_only_when_it_beats_mkl_by_more_than_the_margin(with_onednn, mkl, onednn, expected):
    measure, _ = fake_timings({("mkl", 8, 4, 2): mkl, ("onednn", 8, 4, 2): onednn})
    assert KernelChooser(measure, margin=0.05).choose(8, 4, 2) == expected


def test_the_choice_is_the_median_over_interleaved_rounds(with_onednn):
    answers = {"mkl": iter([1.0, 1.0, 1.0]), "onednn": iter([0.1, 3.0, 3.0])}
    order = []

    def measure(kernel, *shape):
        order.append(kernel)
        return next(answers[kernel])

    assert KernelChooser(measure, rounds=3).choose(8, 4, 2) == "mkl"
    assert order == ["mkl", "onednn", "onednn", "mkl", "mkl", "onednn"]


def test_a_shape_is_probed_once_and_each_new_shape_is_probed(with_onednn):
    measure, calls = fake_timings({(k, r, 4, 2): 1.0 for k in ("mkl", "onednn") for r in (8, 16)})
    chooser = KernelChooser(measure, rounds=1)
    for rows in (8, 8, 16, 8, 16):
        chooser.choose(rows, 4, 2)
    assert calls == [("mkl", 8, 4, 2), ("onednn", 8, 4, 2), ("mkl", 16, 4, 2), ("onednn", 16, 4, 2)]


def test_a_build_without_onednn_keeps_mkl_without_probing(monkeypatch):
    monkeypatch.setattr(cpu, "onednn_usable", lambda: False)
    measure, calls = fake_timings({})
    assert KernelChooser(measure).choose(8, 4, 2) == "mkl"
    assert calls == []


def test_the_three_products_of_a_linear_layer_have_their_own_shapes():
    assert product_shape("forward", 100, 4, 12) == (100, 4, 12)
    assert product_shape("input-gradient", 100, 4, 12) == (100, 12, 4)
    assert product_shape("weight-gradient", 100, 4, 12) == (12, 100, 4)
    with pytest.raises(HubViTError, match="direction='sideways'"):
        product_shape("sideways", 100, 4, 12)


def spy_kernels(monkeypatch):
    """Replace both kernels by logging wrappers; returns the log of (kernel, input shape)."""
    log = []
    for name, kernel in list(cpu.LINEAR.items()):

        def spy(input, weight, bias, name=name, kernel=kernel):
            log.append((name, tuple(input.shape)))
            return kernel(input, weight, bias)

        monkeypatch.setitem(cpu.LINEAR, name, spy)
    return log


@needs_onednn
def test_each_direction_runs_on_the_kernel_chosen_for_its_shape(monkeypatch, with_onednn):
    tokens, fan_in, fan_out = 2 * 5, 8, 4
    fast = {
        ("onednn",) + product_shape("forward", tokens, fan_in, fan_out): 1.0,
        ("mkl",) + product_shape("forward", tokens, fan_in, fan_out): 2.0,
        ("onednn",) + product_shape("input-gradient", tokens, fan_in, fan_out): 2.0,
        ("mkl",) + product_shape("input-gradient", tokens, fan_in, fan_out): 1.0,
        ("onednn",) + product_shape("weight-gradient", tokens, fan_in, fan_out): 1.0,
        ("mkl",) + product_shape("weight-gradient", tokens, fan_in, fan_out): 2.0,
    }
    torch.manual_seed(0)
    layer = FastestLinear(fan_in, fan_out)
    layer.chooser = KernelChooser(fake_timings(fast)[0], rounds=1, measure_layer=layer_timings(chosen=0.5)[0])
    log = spy_kernels(monkeypatch)
    x = torch.randn(2, 5, fan_in, requires_grad=True)
    layer(x).square().sum().backward()
    assert log == [("onednn", (2, 5, fan_in)), ("mkl", (2, 5, fan_out)), ("onednn", (fan_out, tokens))]
    reference = nn.Linear(fan_in, fan_out)
    reference.load_state_dict(layer.state_dict())
    x_ref = x.detach().clone().requires_grad_(True)
    reference(x_ref).square().sum().backward()
    assert_close(x.grad, x_ref.grad)
    assert_close(layer.weight.grad, reference.weight.grad)


def test_training_keeps_pytorchs_own_backward_where_the_probe_keeps_mkl_for_all_three_products(with_onednn):
    """The custom autograd function costs Python and copies in every step; it is worth it only where oneDNN wins."""
    tokens, fan_in, fan_out = 2 * 5, 8, 4
    slower_onednn = {
        (kernel,) + product_shape(direction, tokens, fan_in, fan_out): {"mkl": 1.0, "onednn": 2.0}[kernel]
        for kernel in ("mkl", "onednn")
        for direction in ("forward", "input-gradient", "weight-gradient")
    }
    layer = FastestLinear(fan_in, fan_out)
    layer.chooser = KernelChooser(fake_timings(slower_onednn)[0], rounds=1)
    output = layer(torch.randn(2, 5, fan_in, requires_grad=True))
    assert "FastestLinearFunction" not in type(output.grad_fn).__name__
    one_onednn = {**slower_onednn, ("onednn",) + product_shape("weight-gradient", tokens, fan_in, fan_out): 0.5}
    layer.chooser = KernelChooser(fake_timings(one_onednn)[0], rounds=1, measure_layer=layer_timings(chosen=0.5)[0])
    output = layer(torch.randn(2, 5, fan_in, requires_grad=True))
    assert "FastestLinearFunction" in type(output.grad_fn).__name__


def layer_timings(pytorch=1.0, chosen=1.0):
    """A `measure_layer` answering each route's step time, logging (route, input shape, needs)."""
    calls = []

    def measure_layer(route, input_shape, fan_in, fan_out, needs, chooser):
        calls.append((route, tuple(input_shape), needs))
        return {"pytorch": pytorch, "chosen": chosen}[route]

    return measure_layer, calls


@pytest.mark.parametrize("chosen, expected", [(1.0, False), (0.97, False), (0.5, True)])
def test_training_takes_the_chosen_kernels_only_where_the_layers_whole_step_is_faster(with_onednn, chosen, expected):
    """Issue 39: every product timed alone chose oneDNN, yet the step ran 0.95x on AMD Zen 4 (the Python backward
    and its operand copies were never timed). The layer's forward and backward, timed together on its input shape,
    decide: PyTorch's own unless the chosen kernels beat it by more than the margin."""
    tokens, fan_in, fan_out = 2 * 5, 8, 4
    onednn_everywhere = {
        (kernel,) + product_shape(direction, tokens, fan_in, fan_out): {"mkl": 2.0, "onednn": 1.0}[kernel]
        for kernel in ("mkl", "onednn")
        for direction in ("forward", "input-gradient", "weight-gradient")
    }
    measure_layer, calls = layer_timings(pytorch=1.0, chosen=chosen)
    layer = FastestLinear(fan_in, fan_out)
    layer.chooser = KernelChooser(fake_timings(onednn_everywhere)[0], rounds=3, measure_layer=measure_layer)
    for _ in range(2):
        output = layer(torch.randn(2, 5, fan_in, requires_grad=True))
        assert ("FastestLinearFunction" in type(output.grad_fn).__name__) is expected
    assert calls == [
        (route, (2, 5, fan_in), (True, True, True))
        for route in ("pytorch", "chosen", "chosen", "pytorch", "pytorch", "chosen")
    ], "probed once per shape, interleaved, with the layer's own input shape and gradients"


@needs_onednn
def test_the_layer_probe_runs_both_routes_forward_and_backward():
    chooser = KernelChooser(lambda kernel, *shape: {"mkl": 2.0, "onednn": 1.0}[kernel], rounds=1)
    for needs in ((True, True, True), (False, True, None)):
        for route in cpu.ROUTES:
            assert cpu.time_layer(route, (2, 5, 8), 8, 4, needs, chooser, repeats=1) > 0


def test_under_inference_the_forward_kernel_is_the_chosen_one(monkeypatch, with_onednn):
    layer = FastestLinear(8, 4)
    measure, _ = fake_timings({("mkl", 6, 8, 4): 1.0, ("onednn", 6, 8, 4): 2.0})
    layer.chooser = KernelChooser(measure, rounds=1)
    log = spy_kernels(monkeypatch)
    with torch.inference_mode():
        layer(torch.randn(3, 2, 8))
    assert log == [("mkl", (3, 2, 8))]


@pytest.mark.parametrize("size", [(32, 32), (40, 24)])
def test_logits_equal_the_default(size):
    default, fast = pair()
    with torch.no_grad():
        assert_close(fast(pixels(*size)).logits, default(pixels(*size)).logits)


def test_logits_equal_the_default_with_a_distillation_token():
    default, fast = pair(distillation_token=True, distillation_head=True)
    with torch.no_grad():
        assert_close(fast(pixels()).logits, default(pixels()).logits)


def test_hidden_states_equal_the_default_and_cover_every_token_when_asked_for():
    default, fast = pair()
    with torch.no_grad():
        expected = default(pixels(), output_hidden_states=True).hidden_states
        actual = fast(pixels(), output_hidden_states=True).hidden_states
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert_close(a, e)


def test_the_last_block_skips_unread_tokens_only_when_asked_to():
    seen = {}
    for skip in (True, False):
        model = optimize_for_cpu(make(), skip_unread_tokens=skip)
        model.hubvit.norm.register_forward_hook(lambda m, i, o, skip=skip: seen.__setitem__(skip, o.shape[1]))
        with torch.no_grad():
            model(pixels())
    assert seen == {True: 1, False: 1 + 16}


def test_the_body_alone_keeps_every_token():
    default, fast = make(HubViTModel), None
    fast = optimize_for_cpu(copy.deepcopy(default))
    with torch.no_grad():
        assert_close(fast(pixels()).last_hidden_state, default(pixels()).last_hidden_state)


def test_state_dict_is_unchanged():
    default, fast = pair()
    expected, actual = default.state_dict(), fast.state_dict()
    assert list(actual) == list(expected)
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name


def test_save_pretrained_writes_the_same_files(tmp_path):
    default, fast = pair()
    default.save_pretrained(tmp_path / "default")
    fast.save_pretrained(tmp_path / "fast")

    def digests(folder):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).iterdir())}

    assert digests(tmp_path / "fast") == digests(tmp_path / "default")
    reloaded = AutoModelForImageClassification.from_pretrained(tmp_path / "fast")
    assert all(type(m) is nn.Linear for m in reloaded.hubvit.encoder.modules() if isinstance(m, nn.Linear))


@needs_onednn
def test_gradients_equal_the_default():
    default, fast = pair()
    labels = torch.tensor([1, 3])
    for model in (default, fast):
        model.train()
        model(pixels(), labels=labels).loss.backward()
    for (name, expected), actual in zip(default.named_parameters(), fast.parameters()):
        assert_close(actual.grad, expected.grad)


@needs_onednn
def test_a_trainable_bias_under_a_frozen_weight_gets_its_gradient():
    torch.manual_seed(0)
    layer = FastestLinear(8, 4)
    layer.weight.requires_grad_(False)
    x = torch.randn(2, 5, 8)
    layer(x).square().sum().backward()
    expected = (2 * torch.nn.functional.linear(x, layer.weight, layer.bias)).sum((0, 1))
    assert_close(layer.bias.grad, expected)


def test_other_dtypes_fall_back_to_f_linear():
    default, fast = pair()
    with torch.no_grad():
        expected = default.to(torch.float64)(pixels().double()).logits
        actual = fast.to(torch.float64)(pixels().double()).logits
    assert actual.dtype == torch.float64
    assert_close(actual, expected, rtol=1e-12)


def test_a_model_without_an_encoder_is_refused():
    with pytest.raises(HubViTError, match="expects a HubViTModel or HubViTForImageClassification, got Linear"):
        optimize_for_cpu(nn.Linear(2, 2))


@pytest.fixture(scope="module")
def digits_model():
    """A small hubvit classifier trained here on scikit-learn's digits (8x8, 1,437 train / 360 held-out images)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 8.0 - 1.0
    labels = torch.tensor(digits.target)
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(labels), generator=generator)
    train, held_out = order[:1437], order[1437:]
    torch.manual_seed(0)
    config = tiny_config(
        image_size=8,
        patch_size=4,
        num_channels=1,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=10,
    )
    model = HubViTForImageClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # products this small gain nothing from a second thread and stall on a busy machine
    try:
        for _ in range(10):
            for batch in train[torch.randperm(len(train), generator=generator)].split(64):
                optimizer.zero_grad()
                model(images[batch], labels=labels[batch]).loss.backward()
                optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval(), images[held_out], labels[held_out]


def predictions(model, images):
    with torch.no_grad():
        return model(images).logits.argmax(-1)


def test_int8_agrees_with_float32_on_99_percent_of_held_out_digits(digits_model):
    model, images, labels = digits_model
    expected = predictions(model, images)
    assert (expected == labels).float().mean() >= 0.9, "the float model did not learn the digits"
    quantized = optimize_for_cpu(copy.deepcopy(model), precision="int8")
    actual = predictions(quantized, images)
    agreement = (actual == expected).float().mean().item()
    accuracy_drop = ((expected == labels).float().mean() - (actual == labels).float().mean()).item()
    assert agreement >= 0.99, f"top-1 agreement {agreement:.4f}"
    assert accuracy_drop <= 0.01, f"held-out accuracy fell by {accuracy_drop:.4f}"


def measured_faster(model, route, calls=None):
    """Let the bf16 probe of an optimized `model` find `route` faster, recording each measurement in `calls`."""

    def measure(run):
        if calls is not None:
            calls.append(run)
        return {"float32": 1.0, "bf16": 2.0} if route == "float32" else {"float32": 2.0, "bf16": 1.0}

    model.hubvit.encoder.bfloat16_probe.measure = measure
    return model


def test_bf16_agrees_with_float32_on_99_percent_of_held_out_digits(digits_model, monkeypatch):
    """The flags are forced, and the probe told bfloat16 is faster, so the bound is checked on every CPU (autocast
    emulates bfloat16 where it is not native: the numbers are the same, only slower)."""
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    model, images, labels = digits_model
    expected = predictions(model, images)
    actual = predictions(measured_faster(optimize_for_cpu(copy.deepcopy(model), precision="bf16"), "bf16"), images)
    agreement = (actual == expected).float().mean().item()
    assert agreement >= 0.99, f"top-1 agreement {agreement:.4f}"


def test_bf16_keeps_the_residual_stream_and_returned_states_in_float32(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx512f", "amx_bf16"}))
    fast = optimize_for_cpu(optimize_for_cpu(make(), precision="bf16"), precision="bf16")
    assert type(fast.hubvit.encoder).__mro__[1] is cpu.BFloat16Encoder, "the encoder was wrapped twice"
    with torch.no_grad():
        outputs = fast(pixels(), output_hidden_states=True)
    assert outputs.logits.dtype == torch.float32
    assert {state.dtype for state in outputs.hidden_states} == {torch.float32}


def test_int8_quantizes_the_encoder_projections_and_keeps_the_rest_in_float(digits_model):
    quantized = optimize_for_cpu(copy.deepcopy(digits_model[0]), precision="int8")
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    encoder = [m for m in quantized.hubvit.encoder.modules() if isinstance(m, DynamicLinear)]
    assert len(encoder) == 4 * quantized.config.num_hidden_layers
    assert type(quantized.classifier) is nn.Linear
    assert type(quantized.hubvit.embeddings.patch_embedding) is nn.Conv2d
    assert all(type(m) is nn.LayerNorm for name, m in quantized.named_modules() if "norm" in name.split(".")[-1])
    assert not quantized.training


@pytest.mark.heavy
def test_int8_prints_no_deprecation_notice_of_torch_ao_quantization():
    """In a fresh process: torch warns about quantized tensors once per process, so an earlier test would hide it."""
    import subprocess
    import sys

    code = (
        "import warnings; warnings.simplefilter('always')\n"
        "from hubvit import HubViTConfig, HubViTForImageClassification, optimize_for_cpu\n"
        "config = HubViTConfig(image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,"
        " intermediate_size=32, num_labels=3)\n"
        "optimize_for_cpu(HubViTForImageClassification(config), precision='int8')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if "quantiz" in line] == []


def test_bf16_is_refused_on_a_cpu_without_native_bf16(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx", "avx2", "fma", "avx512f"}))
    model = make()
    with pytest.raises(HubViTError, match=r"precision='bf16' needs a CPU with native bfloat16 .* this one has AVX-512"):
        optimize_for_cpu(model, precision="bf16")
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear)), "the model was changed"


def test_bf16_where_native_runs_the_encoder_in_bfloat16(monkeypatch):
    """bfloat16 keeps 8 bits of mantissa: 2^-8 relative per product, a few times that over two blocks (3e-2)."""
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    default = make()
    fast = measured_faster(optimize_for_cpu(copy.deepcopy(default), precision="bf16"), "bf16")
    with torch.no_grad():
        expected, actual = default(pixels()).logits, fast(pixels()).logits
    assert actual.dtype == torch.float32
    assert_close(actual, expected, rtol=3e-2)
    assert not torch.equal(actual, expected), "bf16 route computed in float32"
    assert fast.state_dict().keys() == default.state_dict().keys()


def test_bf16_measured_slower_keeps_float32_and_says_why(monkeypatch, caplog):
    """As on a Xeon with AVX512-BF16 and no AMX, where bfloat16 autocast ran ViT-S/16 at 0.60x float32."""
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    default = make()
    fast = measured_faster(optimize_for_cpu(copy.deepcopy(default), precision="bf16"), "float32")
    with torch.no_grad(), caplog.at_level("INFO", logger="hubvit.cpu"):
        actual, expected = fast(pixels()).logits, default(pixels()).logits
    assert_close(actual, expected, rtol=1e-5)  # float32 parity; bfloat16 differs by about 1e-2 here
    assert "keeping float32" in caplog.text and "2000.0 ms in bfloat16 against 1000.0 ms in float32" in caplog.text


def test_the_bf16_probe_measures_once_per_input_shape(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    calls = []
    fast = measured_faster(optimize_for_cpu(make(), precision="bf16"), "bf16", calls)
    with torch.no_grad():
        for batch in (2, 2, 3, 2):
            fast(torch.randn(batch, 3, 32, 32))
    assert len(calls) == 2
    real = cpu.time_encoder_routes(lambda route: None, rounds=2)
    assert set(real) == {"float32", "bf16"} and all(seconds >= 0 for seconds in real.values())


@pytest.mark.parametrize("precision", ["fp16", "int4", None])
def test_an_unknown_precision_is_refused(precision):
    with pytest.raises(HubViTError, match=f"precision={precision!r}: expected one of"):
        optimize_for_cpu(make(), precision=precision)


@pytest.mark.parametrize(
    "flags, isa",
    [
        ({"avx2"}, "AVX2"),
        ({"avx2", "avx512f"}, "AVX-512"),
        ({"avx512f", "avx512_bf16"}, "AVX512-BF16"),
        ({"avx512f", "avx512_bf16", "amx_bf16"}, "AMX"),
    ],
)
def test_the_isa_is_named_from_the_cpu_flags(flags, isa):
    assert cpu.cpu_isa(frozenset(flags)) == isa


@pytest.mark.heavy
def test_export_onnx_int8_quantizes_the_encoder_and_agrees_on_99_percent_of_held_out_digits(digits_model, tmp_path):
    onnx = pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from hubvit.folder import write_folder
    from hubvit.cli import main as cli

    model, images, _ = digits_model
    write_folder(model, tmp_path / "src")
    assert cli(["export", "onnx", str(tmp_path / "src"), str(tmp_path / "model.onnx"), "--int8"]) == 0
    graph = onnx.load(str(tmp_path / "model.onnx")).graph
    operators = [node.op_type for node in graph.node]
    assert operators.count("MatMulInteger") == 4 * model.config.num_hidden_layers
    assert operators.count("MultiHeadAttention") == model.config.num_hidden_layers, "int8 quantizes the fused graph"
    assert "Conv" in operators and ("Gemm" in operators or "MatMul" in operators), "embedding or head quantized"
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"pixel_values": images.numpy()})
    expected = predictions(model, images)
    agreement = (torch.from_numpy(logits).argmax(-1) == expected).float().mean().item()
    assert agreement >= 0.99, f"top-1 agreement {agreement:.4f}"
    report = json.loads((tmp_path / "model.verification.json").read_text())
    assert report["int8"]["quantized_nodes"] == 4 * model.config.num_hidden_layers


# Modern block components (the rotary kinds, gated MLPs with inner norm, separate projections, BEiT's bias) on the
# int8 route: (config fields, linear layers per block that onnxruntime's dynamic quantization turns into MatMulInteger)
INT8_FAMILIES = {
    "dinov3_like": (
        dict(position_embedding_type="none", rope_type="dinov3", layer_scale_init_value=1e-5, num_register_tokens=4),
        4,
    ),
    "eva02_like": (
        dict(
            rope_type="axial",
            mlp_type="gated",
            hidden_act="silu",
            mlp_inner_norm=True,
            qkv_fused=False,
            key_bias=False,
            class_token=False,
            pooling="mean",
            fc_norm=True,
        ),
        6,
    ),
    "beit_like": (dict(position_embedding_type="relative_2d_class", key_bias=False, layer_scale_init_value=0.1), 4),
}


@pytest.mark.heavy
@pytest.mark.parametrize("family", list(INT8_FAMILIES))
def test_export_onnx_int8_quantizes_every_encoder_matmul_of_the_modern_families(family, tmp_path):
    """Every linear layer of every block becomes MatMulInteger and the graph runs in onnxruntime within 10% of the
    float model's logit scale: dynamic int8 of weights and activations measured 2-4% on these random models (a
    wrong rotation or a dropped bias moves logits by their whole scale)."""
    onnx = pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from hubvit import HubViTForImageClassification
    from hubvit.folder import write_folder
    from hubvit.cli import main as cli
    from utils import randomize_, tiny_config

    fields, per_block = INT8_FAMILIES[family]
    model = randomize_(HubViTForImageClassification(tiny_config(num_labels=5, image_size=32, **fields))).eval()
    write_folder(model, tmp_path / "src")
    assert cli(["export", "onnx", str(tmp_path / "src"), str(tmp_path / "model.onnx"), "--int8"]) == 0
    operators = [node.op_type for node in onnx.load(str(tmp_path / "model.onnx")).graph.node]
    assert operators.count("MatMulInteger") == per_block * model.config.num_hidden_layers
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    pixels = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    (logits,) = session.run(None, {"pixel_values": pixels.numpy()})
    with torch.no_grad():
        expected = model(pixel_values=pixels).logits
    assert (torch.from_numpy(logits) - expected).abs().max() <= 0.1 * expected.abs().max()
