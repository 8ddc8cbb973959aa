"""`hubvit.optimize_for_cpu`: the same function, parameters and files as the default model, computed through oneDNN.

Tolerance: oneDNN sums the products in another order than the BLAS sgemm, so outputs (and gradients) agree to
float32 rounding accumulated over two tiny blocks: 1e-5 relative to the output scale.
"""

import copy
import hashlib
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from transformers import AutoModelForImageClassification

import hubvit
from hubvit import HubViTForImageClassification, HubViTModel, optimize_for_cpu
from hubvit.cpu import OneDNNLinear
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


def test_every_encoder_projection_becomes_a_onednn_linear_that_is_still_an_nn_linear():
    model = optimize_for_cpu(make())
    linears = [m for m in model.hubvit.encoder.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 4 * model.config.num_hidden_layers
    assert all(type(m) is OneDNNLinear for m in linears)
    assert type(model.classifier) is nn.Linear


@needs_onednn
def test_forward_reaches_onednn(monkeypatch):
    model = optimize_for_cpu(make())
    calls = []
    original = torch.ops.mkldnn._linear_pointwise

    class Spy:
        def __call__(self, *args):
            calls.append(args[0].shape)
            return original(*args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", Spy())
    with torch.no_grad():
        model(pixels())
    assert len(calls) == 4 * model.config.num_hidden_layers


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
    layer = OneDNNLinear(8, 4)
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
    with pytest.raises(TypeError, match="expects a HubViTModel or HubViTForImageClassification, got Linear"):
        optimize_for_cpu(nn.Linear(2, 2))
