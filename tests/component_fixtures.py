"""The folders written before the model was split into components (tests/fixtures/make_component_fixtures.py), and
the one function that computes every output they are compared on, so the writer and the test do the same."""

from pathlib import Path

import torch

ROOT = Path(__file__).parent / "fixtures" / "before-components-2026-12-07"

# name: config overrides on tests/utils.py's tiny config (32 x 32 images, 8 x 8 patches), the other input size, and
# what else the folder is read as. Together: every position kind, every pooling, registers, distillation, the
# CLIP-like options, a non-square image and patch, padding, a backbone and a segmentation head.
FIXTURES = {
    "learned-cls": dict(config=dict(num_labels=3), other=(40, 24)),
    "learned-registers-no-prefix-rows": dict(
        config=dict(num_labels=3, num_register_tokens=2, position_embedding_includes_prefix=False),
        other=(48, 40),
    ),
    "learned-2d-first": dict(
        config=dict(num_labels=3, position_embedding_type="learned_2d", class_token=False, pooling="first"),
        other=(24, 40),
    ),
    "relative-2d-layerscale-mean-fc-norm": dict(
        config=dict(
            num_labels=3,
            position_embedding_type="relative_2d",
            layer_scale_init_value=0.1,
            pooling="mean",
            fc_norm=True,
        ),
        other=(40, 48),
    ),
    "sincos-2d-map": dict(
        config=dict(num_labels=3, position_embedding_type="sincos_2d", class_token=False, pooling="map"),
        other=(40, 24),
    ),
    "none-mean": dict(config=dict(num_labels=3, position_embedding_type="none", pooling="mean"), other=(48, 48)),
    "distilled": dict(config=dict(num_labels=3, distillation_token=True), other=(40, 24)),
    "clip-like": dict(
        config=dict(
            num_labels=3,
            pre_norm=True,
            patch_bias=False,
            hidden_act="quick_gelu",
            layer_norm_eps=1e-5,
            qkv_bias=True,
        ),
        other=(40, 24),
    ),
    "jax-like-representation": dict(
        config=dict(
            num_labels=3,
            hidden_act="gelu_pytorch_tanh",
            interpolation_mode="bilinear",
            interpolation_antialias=False,
            interpolation_align_corners=True,
            representation_size=24,
        ),
        other=(48, 40),
    ),
    "non-square-cls-mean": dict(
        config=dict(
            num_labels=3,
            image_size=[32, 48],
            patch_size=[8, 12],
            pooling="cls_mean",
            final_layer_norm_eps=1e-5,
            qkv_bias=False,
        ),
        other=(48, 36),
    ),
    "padded-learned": dict(config=dict(num_labels=3, dynamic_img_pad=True), other=(37, 29)),
    "backbone-tokens": dict(
        config=dict(
            num_labels=3,
            out_indices=[0, 1, 2],
            num_register_tokens=1,
            apply_layernorm=False,
            reshape_hidden_states=False,
        ),
        other=(40, 24),
    ),
    "segmentation-pixels": dict(
        config=dict(num_labels=3, decode_head_pixels=True, out_indices=[1, 2]),
        other=(40, 24),
        segmentation=True,
    ),
}


def fixture_inputs(fixture):
    """Two images at the native size and two at the fixture's other size, fixed by a seed."""
    from utils import tiny_config

    native = tuple(tiny_config(**fixture["config"]).image_size_2d)
    generator = torch.Generator().manual_seed(7)
    return {
        "native": torch.randn(2, 3, *native, generator=generator),
        "other": torch.randn(2, 3, *fixture["other"], generator=generator),
    }


@torch.no_grad()
def fixture_outputs(folder, fixture, inputs):
    """{name: tensor}: for each input, the head's logits under sdpa and eager, every hidden state and attention, the
    body's last hidden state and pooled vector, `forward_intermediates` (normed maps of every block) and the
    backbone's feature maps for the folder's stages."""
    from hubvit import HubViTBackbone, HubViTForImageClassification, HubViTForSemanticSegmentation, HubViTModel

    folder = str(folder)
    head = HubViTForSemanticSegmentation if fixture.get("segmentation") else HubViTForImageClassification
    tensors = {}
    for attention in ("sdpa", "eager"):
        model = head.from_pretrained(folder, attn_implementation=attention).eval()
        body = HubViTModel.from_pretrained(folder, attn_implementation=attention).eval()
        backbone = HubViTBackbone.from_pretrained(folder, attn_implementation=attention).eval()
        for size, x in inputs.items():
            key = f"{size}.{attention}"
            full = model(x, output_hidden_states=True, output_attentions=attention == "eager")
            tensors[f"{key}.logits"] = full.logits
            for index, state in enumerate(full.hidden_states):
                tensors[f"{key}.hidden_states.{index}"] = state
            for index, weights in enumerate(full.attentions or ()):
                tensors[f"{key}.attentions.{index}"] = weights
            features = body(x)
            tensors[f"{key}.last_hidden_state"] = features.last_hidden_state
            if features.pooler_output is not None:
                tensors[f"{key}.pooler_output"] = features.pooler_output
            final, intermediates = body.forward_intermediates(x, norm=True)
            tensors[f"{key}.intermediates.final"] = final
            for index, state in enumerate(intermediates):
                tensors[f"{key}.intermediates.{index}"] = state
            for index, state in enumerate(backbone(x).feature_maps):
                tensors[f"{key}.feature_maps.{index}"] = state
    return {name: tensor.contiguous() for name, tensor in tensors.items()}
