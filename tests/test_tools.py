"""The model with third-party tools nobody here wrote: dynamic quantization, Grad-CAM (the `grad-cam` package) against
timm on the same weights, forward hooks, a PEFT LoRA adapter, transformers' layer selection, and tracing.

Models are tiny (2 to 3 blocks, 32 wide, 32x32 images of 8x8 patches) with every weight random and away from the
paper's initialisation (its zero head would make every logit 0 and hide errors).
"""

import functools
import json

import pytest
import torch
from torch import nn

import utils
from hubvit import HubViTConfig, HubViTForImageClassification, HubViTModel
from utils import randomize_, relative_error

TINY = dict(utils.TINY, num_labels=3)
GRID = (4, 4)  # 32 / 8


def classifier(**overrides):
    return randomize_(HubViTForImageClassification(HubViTConfig(**{**TINY, **overrides}))).eval()


def pixels(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Logits(nn.Module):
    """The wrapper Grad-CAM's and tracing's documentation use for Hugging Face models: pixels in, logits out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).logits


# --- dynamic quantization -----------------------------------------------------------------------------------------


def test_quantize_dynamic_quantizes_every_projection():
    """Every nn.Linear (qkv, attention output, both MLP layers of each block, the head) becomes a dynamically
    quantized Linear, as all 13 of transformers' ViT do. Logits stay within 10% of the float32 logit scale: int8
    weights (one scale per tensor) and int8 activations through 9 matmuls gave 4.8% to 5.8% on these random weights
    over three seeds; a skipped encoder gives 0 and a broken one O(1)."""
    from torch.ao.nn.quantized.dynamic import Linear as QuantizedLinear
    from torch.ao.quantization import quantize_dynamic

    model = classifier()
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    assert len(linears) == 4 * TINY["num_hidden_layers"] + 1
    quantized = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    kinds = {name: type(module) for name, module in quantized.named_modules()}
    assert {name: kinds[name] for name in linears} == {name: QuantizedLinear for name in linears}
    assert not [name for name, kind in kinds.items() if kind is nn.Linear]
    x = pixels(4, 3, 32, 32)
    with torch.no_grad():
        error = relative_error(quantized(pixel_values=x).logits, model(pixel_values=x).logits)
    assert 0 < error <= 0.1


# --- hooks and explainability ---------------------------------------------------------------------------------------


def test_forward_hooks_on_every_layer_and_the_final_norm_see_all_tokens():
    model = classifier(num_hidden_layers=3)
    seen = {}
    targets = {f"layer {i}": layer for i, layer in enumerate(model.hubvit.encoder.layers)}
    targets["norm"] = model.hubvit.norm
    for name, module in targets.items():
        module.register_forward_hook(lambda module, args, output, name=name: seen.__setitem__(name, output))
    with torch.no_grad():
        model(pixel_values=pixels(2, 3, 32, 48))
    tokens = 1 + 4 * 6
    assert {name: (type(out), tuple(out.shape)) for name, out in seen.items()} == {
        name: (torch.Tensor, (2, tokens, 32)) for name in targets
    }


@pytest.fixture(scope="module")
def timm_pair(tmp_path_factory):
    """A random timm ViT and the same weights converted by `hubvit convert timm`."""
    timm = pytest.importorskip("timm")
    from timm.models import save_for_hf

    from hubvit.cli import main as cli

    source = timm.create_model(
        "vit_base_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=4,
        mlp_ratio=2.0,
        num_classes=3,
    )
    randomize_(source).eval()
    folder = tmp_path_factory.mktemp("timm")
    save_for_hf(source, folder / "timm", safe_serialization=True)
    assert cli(["convert", "timm", str(folder / "timm"), str(folder / "hubvit")]) == 0
    return source, HubViTForImageClassification.from_pretrained(folder / "hubvit").eval()


@pytest.mark.heavy
@pytest.mark.parametrize("target", ["last block's norm1", "last block", "final norm"])
def test_grad_cam_matches_timm_on_the_same_weights(timm_pair, target):
    """pytorch_grad_cam's GradCAM with its own `vit_reshape_transform` on the layer its docs pick for a ViT
    (`blocks[-1].norm1`), on the last block and on the final norm; the maps equal timm's within 1e-4 (maps are
    normalised to [0, 1]; both sides run the same float32 operations). Only norm1 gives a non-zero map: with [CLS]
    pooling, the last block's and the final norm's patch tokens do not reach the logits, in timm as here."""
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
    from pytorch_grad_cam.utils.reshape_transforms import vit_reshape_transform

    source, model = timm_pair
    layers = {
        "last block's norm1": (model.hubvit.encoder.layers[-1].norm1, source.blocks[-1].norm1),
        "last block": (model.hubvit.encoder.layers[-1], source.blocks[-1]),
        "final norm": (model.hubvit.norm, source.norm),
    }
    ours, theirs = layers[target]
    reshape = functools.partial(vit_reshape_transform, height=GRID[0], width=GRID[1])
    x = pixels(2, 3, 32, 32)
    targets = [ClassifierOutputTarget(1), ClassifierOutputTarget(2)]
    with GradCAM(Logits(model), [ours], reshape_transform=reshape) as cam:
        our_maps = cam(input_tensor=x, targets=targets)
    with GradCAM(source, [theirs], reshape_transform=reshape) as cam:
        their_maps = cam(input_tensor=x, targets=targets)
    assert our_maps.shape == (2, 32, 32)
    assert abs(our_maps - their_maps).max() <= 1e-4
    if target == "last block's norm1":
        assert our_maps.reshape(2, -1).max(axis=1).min() > 0.5


# --- adapters ---------------------------------------------------------------------------------------------------------


@pytest.mark.heavy
def test_lora_on_qkv_trains_saves_and_reloads(tmp_path):
    """A PEFT LoRA adapter on every `qkv` projection (plus the head, trained in full): only those weights train, the
    loss on a fixed batch falls, and the saved adapter on a fresh copy of the base gives the same logits (1e-6)."""
    peft = pytest.importorskip("peft")

    base = classifier()
    base.save_pretrained(tmp_path / "base")
    model = peft.get_peft_model(
        base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["qkv"], modules_to_save=["classifier"])
    )
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    assert trainable and all("lora_" in name or "classifier" in name for name in trainable)
    assert sum("qkv.lora_A" in name for name in trainable) == TINY["num_hidden_layers"]

    x, labels = pixels(8, 3, 32, 32), torch.arange(8) % 3
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    losses = []
    for _ in range(15):
        loss = model(pixel_values=x, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]

    model.eval()
    model.save_pretrained(tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["target_modules"] == ["qkv"]
    fresh = HubViTForImageClassification.from_pretrained(tmp_path / "base").eval()
    reloaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    with torch.no_grad():
        expected = model(pixel_values=x).logits
        torch.testing.assert_close(reloaded(pixel_values=x).logits, expected, rtol=0, atol=1e-6)
        assert (
            relative_error(expected, fresh.__class__.from_pretrained(tmp_path / "base")(pixel_values=x).logits) > 0.01
        )


# --- layer selection ----------------------------------------------------------------------------------------------------


def test_output_hidden_states_selects_layers():
    """transformers 5 records hidden states through `_can_record_outputs`; a list of indices keeps those entries of
    the full tuple (0: the encoder input, i: block i's output) and leaves None in the others, as transformers'
    ViTModel does (5.24)."""
    model = randomize_(HubViTModel(HubViTConfig(**{**TINY, "num_hidden_layers": 3}))).eval()
    x = pixels(2, 3, 32, 32)
    with torch.no_grad():
        every = model(pixel_values=x, output_hidden_states=True).hidden_states
        chosen = model(pixel_values=x, output_hidden_states=[0, 2]).hidden_states
    assert len(every) == len(chosen) == 4
    assert chosen[1] is None and chosen[3] is None
    torch.testing.assert_close(chosen[0], every[0], rtol=0, atol=0)
    torch.testing.assert_close(chosen[2], every[2], rtol=0, atol=0)


# --- tracing ----------------------------------------------------------------------------------------------------------


# The tracer warns that the input checks' Python booleans become constants: expected, they hold at every size.
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_jit_trace_at_one_size_runs_at_another():
    """Traced at 32x32, the graph runs at 48x64 and gives eager's logits (1e-5 of the logit scale, float32)."""
    model = classifier()
    with torch.no_grad():
        traced = torch.jit.trace(Logits(model), pixels(2, 3, 32, 32), check_trace=False)
        x = pixels(3, 3, 48, 64, seed=2)
        assert relative_error(traced(x), model(pixel_values=x).logits) <= 1e-5


def test_make_fx_symbolic_graph_runs_at_other_sizes():
    """`make_fx(..., tracing_mode="symbolic")` records one graph with symbolic batch, height and width; it runs at
    48x64 and 24x16 with eager's logits (1e-5). Plain `torch.fx.symbolic_trace` is not the route: it stops with
    `TraceError: Proxy object cannot be iterated` on transformers' own ViTForImageClassification as on hubvit
    (measured with transformers 5.24, torch 2.14), because transformers 5's output recording runs Python over the
    module outputs."""
    from torch.fx.experimental.proxy_tensor import make_fx

    model = classifier()
    function = Logits(model)
    with torch.no_grad():
        graph = make_fx(function, tracing_mode="symbolic", _allow_non_fake_inputs=True)(pixels(2, 3, 32, 40))
        for shape in ((3, 3, 48, 64), (1, 3, 24, 16)):
            x = pixels(*shape, seed=3)
            assert relative_error(graph(x), function(x)) <= 1e-5, shape
