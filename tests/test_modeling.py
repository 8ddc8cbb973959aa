"""The HubViT model as a specification: architecture, any resolution, backends, persistence and errors.

Tolerances: float32 parity between two computations of the same function is 1e-5 relative to the output scale
(the size of float32 rounding accumulated over a few tiny blocks); identical computations must be bit-exact.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoModelForImageClassification

from hubvit import HubViTConfig, HubViTForImageClassification, HubViTModel
from hubvit.modeling.positions_hubvit import sincos_2d_position_table
from hubvit.modeling.resize_hubvit import resize_position_grid, resize_position_grid_by_matrices
from utils import assert_close, randomize_, tiny_config


def make(config, seed=0, cls=HubViTForImageClassification):
    torch.manual_seed(seed)
    return randomize_(cls(config), seed).eval()


def pixels(height=32, width=32, batch=2, seed=1):
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))


# --- defaults and config validation -------------------------------------------------------------------------------


def test_defaults_are_vit_b16_at_224():
    config = HubViTConfig()
    assert (config.image_size, config.patch_size, config.hidden_size) == (224, 16, 768)
    assert (config.num_hidden_layers, config.num_attention_heads, config.intermediate_size) == (12, 12, 3072)
    assert config.layer_norm_eps == 1e-6 and config.pooling == "cls" and config.class_token
    with torch.device("meta"):
        model = HubViTForImageClassification(HubViTConfig(num_labels=1000))
    # 86.6M parameters for ViT-B/16 with a 1000-class head (the paper's Table 1 / timm).
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == 86.6


@pytest.mark.parametrize(
    "overrides, names",
    [
        (dict(hidden_size=100, num_attention_heads=12), ["hidden_size=100", "num_attention_heads=12"]),
        (dict(class_token=False, pooling="cls"), ["pooling='cls'", "class_token"]),
        (dict(image_size=15, patch_size=16), ["image_size=15", "patch_size=16", "smaller than one patch"]),
        (dict(image_size=(224, 10), patch_size=16), ["image_size", "patch_size=16"]),
        (dict(position_embedding_type="rope"), ["position_embedding_type='rope'", "learned"]),
        (dict(pooling="max"), ["pooling='max'", "mean"]),
        (dict(hidden_act="swish2"), ["hidden_act='swish2'"]),
        (dict(interpolation_mode="area"), ["interpolation_mode='area'", "bicubic"]),
        (dict(fc_norm=True, pooling="map"), ["fc_norm", "pooling='map'"]),
        (dict(distillation_token=True, class_token=False, pooling="mean"), ["distillation_token", "class_token"]),
        (dict(num_register_tokens=-1), ["num_register_tokens"]),
        (dict(distillation_token=True, pooling="map"), ["distillation_token", "pooling='map'"]),
        (dict(layer_norm_eps=0.0), ["layer_norm_eps", "positive"]),
        (dict(final_layer_norm_eps=float("nan")), ["final_layer_norm_eps", "nan"]),
        (dict(hidden_dropout_prob=1.0), ["hidden_dropout_prob", "[0, 1)"]),
        (dict(attention_probs_dropout_prob=-0.1), ["attention_probs_dropout_prob", "-0.1"]),
        (dict(drop_path_rate=1.5), ["drop_path_rate", "1.5"]),
        (dict(distillation_token=True, representation_size=8), ["representation_size=8", "distillation_head"]),
    ],
)
def test_invalid_config_names_the_fields(overrides, names):
    with pytest.raises(ValueError) as error:
        HubViTConfig(**overrides)
    for name in names:
        assert name in str(error.value)


# --- the seed: patch embedding, position tables -------------------------------------------------------------------


def test_patchify_conv_equals_unfold_and_linear():
    model = make(tiny_config())
    conv = model.hubvit.embeddings.patch_embedding
    x = pixels()
    by_conv = conv(x).flatten(2).transpose(1, 2)
    patches = F.unfold(x, kernel_size=8, stride=8).transpose(1, 2)
    by_linear = F.linear(patches, conv.weight.reshape(conv.out_channels, -1), conv.bias)
    assert_close(by_conv, by_linear)


def test_no_position_embedding_with_mean_pooling_is_permutation_invariant():
    """Without positions, attention and MLP are permutation equivariant, so the mean over patches is invariant."""
    model = make(tiny_config(position_embedding_type="none", class_token=False, pooling="mean"), cls=HubViTModel)
    x = pixels(32, 32)
    blocks = x.unfold(2, 8, 8).unfold(3, 8, 8)
    order = torch.randperm(16, generator=torch.Generator().manual_seed(3))
    shuffled = blocks.reshape(2, 3, 16, 8, 8)[:, :, order].reshape(2, 3, 4, 4, 8, 8)
    shuffled = shuffled.permute(0, 1, 2, 4, 3, 5).reshape(2, 3, 32, 32)
    with torch.no_grad():
        original, permuted = model(x), model(shuffled)
    assert_close(permuted.pooler_output, original.pooler_output)
    assert_close(permuted.last_hidden_state, original.last_hidden_state[:, order])
    assert not torch.allclose(permuted.last_hidden_state, original.last_hidden_state, atol=1e-3)


@pytest.mark.parametrize(
    "mode, antialias, align_corners", [("bicubic", True, False), ("bicubic", False, False), ("bilinear", False, True)]
)
@pytest.mark.parametrize("new_grid", [(6, 3), (2, 5), (4, 4)])
def test_position_table_resize_equals_interpolate(mode, antialias, align_corners, new_grid):
    config = tiny_config(
        interpolation_mode=mode, interpolation_antialias=antialias, interpolation_align_corners=align_corners
    )
    embeddings = make(config).hubvit.embeddings
    table = embeddings.position_embedding
    resized = embeddings.position.kind.table(embeddings, new_grid)
    grid = table[:, 1:].reshape(1, 4, 4, -1).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=new_grid, mode=mode, antialias=antialias, align_corners=align_corners)
    expected = expected.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], -1)
    assert torch.equal(resized[:, :1], table[:, :1]), "the [CLS] row must be untouched"
    assert_close(resized[:, 1:], expected, rtol=1e-6)


def test_resize_runs_in_float32_for_low_precision_tables():
    table = torch.randn(1, 16, 8).bfloat16()
    resized = resize_position_grid(table, (4, 4), (6, 6), "bicubic", True, False)
    grid = table.float().reshape(1, 4, 4, 8).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=(6, 6), mode="bicubic", antialias=True).permute(0, 2, 3, 1).reshape(1, 36, 8)
    assert resized.dtype == torch.bfloat16
    assert torch.equal(resized, expected.bfloat16())


def test_sincos_table_matches_big_vision_formula():
    table = sincos_2d_position_table((3, 5), 16)[0]
    omega = 1.0 / 10000 ** (torch.arange(4) / 3.0)
    y, x = 2, 4  # row-major index 2 * 5 + 4
    expected = torch.cat([(x * omega).sin(), (x * omega).cos(), (y * omega).sin(), (y * omega).cos()])
    assert_close(table[2 * 5 + 4], expected, rtol=1e-6)


@pytest.mark.parametrize(
    "mode, antialias, align_corners",
    [
        ("bicubic", True, False),
        ("bicubic", False, False),
        ("bilinear", False, True),
        ("bilinear", False, False),
        ("nearest", False, False),
    ],
)
@pytest.mark.parametrize("grid", [(4, 4), (3, 5), (1, 7)])
def test_resize_to_the_same_grid_is_the_identity_bit_for_bit(mode, antialias, align_corners, grid):
    """A traced graph takes the resize path at every size (one graph for all grids), so there the native grid must
    come back exact: this keeps exported checkpoints bit-exact at their own resolution. Eager forwards skip the
    interpolation at the native grid and hand back the stored table itself (timm's and transformers' early return)."""
    table = torch.randn(1, grid[0] * grid[1], 24, generator=torch.Generator().manual_seed(0))
    assert resize_position_grid(table, grid, grid, mode, antialias, align_corners) is table
    assert torch.equal(resize_position_grid_by_matrices(table, grid, grid, mode, antialias, align_corners), table)


@pytest.mark.parametrize("kind", ["learned", "learned_2d", "relative_2d", "sincos_2d"])
def test_permanent_resize_equals_on_the_fly_resize(kind):
    model = make(tiny_config(position_embedding_type=kind))
    x = pixels(48, 24)
    with torch.no_grad():
        on_the_fly = model(x).logits
        model.resize_position_embeddings((48, 24))
        permanent = model(x).logits
    assert model.config.image_size == [48, 24]
    assert_close(permanent, on_the_fly)


# --- every option runs, on every backend ---------------------------------------------------------------------------

OPTIONS = (
    [
        dict(position_embedding_type=kind, pooling=pool, **tokens)
        for kind, pool, tokens in itertools.product(
            ["learned", "learned_2d", "relative_2d", "sincos_2d", "none"],
            ["cls", "mean", "map"],
            [dict(), dict(num_register_tokens=2)],
        )
    ]
    + [dict(position_embedding_type=kind, distillation_token=True) for kind in ["learned", "relative_2d"]]
    + [
        dict(class_token=False, pooling="mean", position_embedding_type="sincos_2d"),
        dict(class_token=False, pooling="first"),
        dict(pooling="cls_mean", num_register_tokens=2, layer_scale_init_value=0.1),
        dict(class_token=False, pooling="map", position_embedding_includes_prefix=False),
        dict(pooling="mean", fc_norm=True, layer_scale_init_value=0.1),
        dict(pre_norm=True, patch_bias=False, hidden_act="quick_gelu", layer_norm_eps=1e-5),
        dict(representation_size=24, hidden_act="gelu_pytorch_tanh"),
        dict(num_register_tokens=4, position_embedding_includes_prefix=False, layer_scale_init_value=1e-5),
    ]
)


def option_id(options):
    return ",".join(f"{k}={v}" for k, v in options.items())


@pytest.mark.parametrize("options", OPTIONS, ids=option_id)
def test_every_option_runs_forward_and_backward_at_two_sizes(options):
    model = make(tiny_config(num_labels=5, **options))
    model.train()
    for height, width in [(32, 32), (40, 24)]:
        out = model(pixels(height, width), labels=torch.tensor([1, 3]))
        assert out.logits.shape == (2, 5) and torch.isfinite(out.logits).all()
        model.zero_grad()
        out.loss.backward()
        silent = [n for n, p in model.named_parameters() if p.grad is None]
        assert not silent, f"parameters without gradient: {silent}"


@pytest.mark.parametrize("options", OPTIONS[::4], ids=option_id)
def test_eager_and_sdpa_agree(options):
    config = tiny_config(num_labels=5, **options)
    eager = make(config)
    eager.set_attn_implementation("eager")
    sdpa = make(config)
    sdpa.set_attn_implementation("sdpa")
    x = pixels(40, 24)
    with torch.no_grad():
        assert_close(sdpa(x).logits, eager(x).logits)


def test_output_attentions_returns_real_weights_under_sdpa():
    model = make(tiny_config(position_embedding_type="relative_2d"))
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        out = model(pixels(), output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == 2 and len(out.hidden_states) == 3
    weights = out.attentions[0]
    assert weights.shape == (2, 4, 17, 17)
    assert_close(weights.sum(-1), torch.ones(2, 4, 17))
    layer = model.hubvit.encoder.layers[0]
    hidden = layer.norm1(out.hidden_states[0])
    q, k, _ = layer.attention.qkv(hidden).reshape(2, 17, 3, 4, 8).permute(2, 0, 3, 1, 4)
    logits = q @ k.transpose(-1, -2) * 8**-0.5 + layer.attention.position.logits_bias(layer.attention, (4, 4), 17)
    assert_close(weights, logits.softmax(-1))


def test_output_hidden_states_selects_layers_by_index():
    """transformers 5's selection: the chosen entries are recorded, the others are None."""
    model = make(tiny_config(num_hidden_layers=3))
    with torch.no_grad():
        every = model(pixels(), output_hidden_states=True).hidden_states
        chosen = model(pixels(), output_hidden_states=[0, 2]).hidden_states
    assert len(every) == 4
    assert [h is not None for h in chosen] == [True, False, True, False]
    assert torch.equal(chosen[0], every[0]) and torch.equal(chosen[2], every[2])


def test_encoder_layers_return_tensors_of_every_token():
    """What forward hooks (Grad-CAM and friends) see on every block and on the final norm."""
    model = make(tiny_config(num_labels=5))
    seen = []
    modules = [*model.hubvit.encoder.layers, model.hubvit.norm]
    handles = [m.register_forward_hook(lambda module, args, out: seen.append(out)) for m in modules]
    with torch.no_grad():
        model(pixels())
    for handle in handles:
        handle.remove()
    assert [type(out) for out in seen] == [torch.Tensor] * 3
    assert [tuple(out.shape) for out in seen] == [(2, 17, 32)] * 3


def test_num_output_tokens_gives_the_same_logits_for_the_tokens_the_head_reads():
    model = make(tiny_config(num_labels=5))
    x = pixels()
    with torch.no_grad():
        full = model(x).logits
        short = model(x, num_output_tokens=model.hubvit.pooler.num_tokens_read)
        body = model.hubvit(x, num_output_tokens=1)
    assert body.last_hidden_state.shape == (2, 1, 32)
    assert_close(short.logits, full)


def test_final_layer_norm_eps_applies_to_the_final_norm_only():
    """The reference ViT of "ViT from First Principles": blocks at PyTorch's 1e-5, final norm at 1e-6."""
    model = make(tiny_config(layer_norm_eps=1e-5, final_layer_norm_eps=1e-6), cls=HubViTModel)
    assert model.norm.eps == 1e-6
    assert {layer.norm1.eps for layer in model.encoder.layers} == {1e-5}


def enable_checkpointing(model, **options):
    """transformers 5.25 calls it activation checkpointing; the old name still works there, with a FutureWarning."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable(**options)


def gradients_with_and_without_checkpointing(monkeypatch, **options):
    """Gradients of one loss without and with checkpointing, and how many times each block's MLP ran in the second.

    Counted where the MLP's forward starts: in this block (no layer scale, no drop path) torch stops recomputing inside
    fc2, once it has every tensor the backward needs, so a hook on the MLP's return would miss the recomputation.
    """
    from hubvit.modeling.layers_hubvit import HubViTMLP

    config = tiny_config(num_labels=5, drop_path_rate=0.0)
    plain, checkpointed = make(config), make(config)
    enable_checkpointing(checkpointed, **options)
    x, labels = pixels(), torch.tensor([0, 4])
    grads, calls, forward = [], [], HubViTMLP.forward
    for model in (plain, checkpointed):
        model.train()
        if model is checkpointed:
            monkeypatch.setattr(HubViTMLP, "forward", lambda module, h: calls.append(module) or forward(module, h))
        model(x, labels=labels).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    layers = checkpointed.hubvit.encoder.layers
    return checkpointed, grads, [sum(call is layer.mlp for call in calls) for layer in layers]


def test_gradient_checkpointing_recomputes_every_block_and_gives_the_same_gradients(monkeypatch):
    checkpointed, (plain, recomputed), runs = gradients_with_and_without_checkpointing(monkeypatch)
    assert all(layer.gradient_checkpointing for layer in checkpointed.hubvit.encoder.layers)
    assert runs == [2] * len(runs)
    for name, grad in plain.items():
        assert_close(recomputed[name], grad)


@pytest.mark.skipif(
    not hasattr(HubViTModel, "activation_checkpointing_enable"), reason="every_n_layers came with transformers 5.25"
)
def test_checkpointing_every_other_block_recomputes_those_only(monkeypatch):
    checkpointed, (plain, recomputed), runs = gradients_with_and_without_checkpointing(monkeypatch, every_n_layers=2)
    assert runs == [2 if index % 2 == 0 else 1 for index in range(len(runs))]
    for name, grad in plain.items():
        assert_close(recomputed[name], grad)


@pytest.mark.parametrize("options", [dict(), dict(position_embedding_type="relative_2d", pooling="map")], ids=option_id)
def test_compiles_fullgraph_without_graph_breaks(options):
    model = make(tiny_config(num_labels=5, **options))
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    x = pixels(40, 24)
    with torch.no_grad():
        assert_close(compiled(x).logits, model(x).logits)


def test_bf16_autocast_runs_close_to_fp32():
    model = make(tiny_config(num_labels=5))
    x = pixels()
    with torch.no_grad():
        reference = model(x).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(x).logits
    assert low.dtype == torch.bfloat16
    # bf16 keeps 8 bits of mantissa: about 1% relative error after a few matmuls.
    assert_close(low.float(), reference, rtol=0.1)


# --- heads and losses ----------------------------------------------------------------------------------------------


def test_pooler_output_is_what_the_classifier_reads():
    model = make(tiny_config(num_labels=5, pooling="mean", fc_norm=True, class_token=False))
    x = pixels()
    with torch.no_grad():
        out = model.hubvit(x)
        logits = model(x).logits
        tokens = out.last_hidden_state
        expected_pool = model.hubvit.pooler.fc_norm(tokens.mean(1))
    assert_close(out.pooler_output, expected_pool)
    assert_close(logits, model.classifier(out.pooler_output))


def test_fc_norm_with_cls_pooling_norms_the_cls_token_alone():
    """transformers' CLIP: `post_layernorm` on the pooled [CLS], `last_hidden_state` not normed."""
    model = make(tiny_config(num_labels=5, pre_norm=True, fc_norm=True)).eval()
    x = pixels()
    with torch.no_grad():
        out = model.hubvit(x, output_hidden_states=True)
    assert_close(out.last_hidden_state, out.hidden_states[-1])
    assert_close(out.pooler_output, model.hubvit.pooler.fc_norm(out.last_hidden_state[:, 0]))


def test_cls_mean_pooling_concatenates_cls_and_patch_mean():
    """DINOv2's linear-probe input: [CLS] next to the mean of the patch tokens (registers excluded)."""
    model = make(tiny_config(num_labels=5, pooling="cls_mean", num_register_tokens=2))
    with torch.no_grad():
        body = model.hubvit(pixels())
        logits = model(pixels()).logits
    tokens = body.last_hidden_state
    expected = torch.cat([tokens[:, 0], tokens[:, 3:].mean(1)], dim=-1)
    assert body.pooler_output.shape == (2, 64)
    assert_close(body.pooler_output, expected)
    assert_close(logits, model.classifier(expected))


def test_distillation_heads_are_averaged():
    model = make(tiny_config(num_labels=5, distillation_token=True))
    with torch.no_grad():
        out = model(pixels())
        tokens = model.hubvit(pixels()).last_hidden_state
    assert_close(out.cls_logits, model.classifier(tokens[:, 0]))
    assert_close(out.distillation_logits, model.distillation_classifier(tokens[:, 1]))
    assert_close(out.logits, (out.cls_logits + out.distillation_logits) / 2)


def test_distillation_token_without_its_head_classifies_from_cls():
    """transformers' DeiTForImageClassification: the body keeps the distillation token, one head reads [CLS]."""
    model = make(tiny_config(num_labels=5, distillation_token=True, distillation_head=False))
    with torch.no_grad():
        out = model(pixels())
        body = model.hubvit(pixels())
    assert model.distillation_classifier is None
    assert torch.equal(body.pooler_output, body.last_hidden_state[:, 0])
    assert_close(out.logits, model.classifier(body.last_hidden_state[:, 0]))


def test_zero_labels_gives_identity_head():
    model = make(tiny_config(num_labels=0))
    with torch.no_grad():
        out = model(pixels())
        pooled = model.hubvit(pixels()).pooler_output
    assert isinstance(model.classifier, torch.nn.Identity)
    assert torch.equal(out.logits, pooled)


@pytest.mark.parametrize(
    "num_labels, labels, expected_type",
    [
        (5, torch.tensor([1, 4]), "single"),
        (5, torch.tensor([[1.0, 0, 0, 1, 0], [0, 1, 0, 0, 0]]), "multi"),
        (1, torch.tensor([0.5, -1.0]), "regression"),
    ],
)
def test_loss_follows_transformers_problem_types(num_labels, labels, expected_type):
    model = make(tiny_config(num_labels=num_labels))
    out = model(pixels(), labels=labels)
    if expected_type == "single":
        expected = F.cross_entropy(out.logits, labels)
    elif expected_type == "multi":
        expected = F.binary_cross_entropy_with_logits(out.logits, labels)
    else:
        expected = F.mse_loss(out.logits.squeeze(-1), labels)
    assert_close(out.loss, expected)


def test_initialisation_follows_the_paper():
    torch.manual_seed(0)
    model = HubViTForImageClassification(tiny_config(num_labels=5, hidden_size=64, intermediate_size=128))
    assert torch.count_nonzero(model.classifier.weight) == 0, "zero-initialised head"
    assert torch.count_nonzero(model.hubvit.embeddings.class_token) == 0
    table = model.hubvit.embeddings.position_embedding
    assert 0.015 < table.std().item() < 0.025, "position table ~ N(0, 0.02)"
    fc1 = model.hubvit.encoder.layers[0].mlp.fc1.weight
    bound = (6 / sum(fc1.shape)) ** 0.5
    assert fc1.abs().max() <= bound and fc1.abs().max() > 0.9 * bound, "Xavier-uniform dense kernels"


# --- persistence ---------------------------------------------------------------------------------------------------


def test_save_and_load_round_trip_is_exact(tmp_path):
    model = make(tiny_config(num_labels=5, position_embedding_type="relative_2d", num_register_tokens=2))
    model.save_pretrained(tmp_path)
    loaded, info = AutoModelForImageClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert type(loaded) is HubViTForImageClassification
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    x = pixels(40, 24)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(x).logits, model(x).logits)


def test_missing_and_unexpected_keys_are_reported(tmp_path):
    from safetensors.torch import load_file, save_file

    model = make(tiny_config(num_labels=5))
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights.pop("hubvit.encoder.layers.1.mlp.fc2.weight")
    weights["hubvit.encoder.layers.1.mlp.fc3.weight"] = torch.zeros(3)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    _, info = AutoModelForImageClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert "hubvit.encoder.layers.1.mlp.fc2.weight" in info["missing_keys"]
    assert "hubvit.encoder.layers.1.mlp.fc3.weight" in info["unexpected_keys"]


def test_auto_classes_know_hubvit_without_trust_flag(tmp_path):
    model = make(tiny_config(), cls=HubViTModel)
    model.save_pretrained(tmp_path)
    assert type(AutoModel.from_pretrained(tmp_path)) is HubViTModel


# --- bad inputs ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, words",
    [
        (torch.randn(2, 1, 32, 32), ["1 channels", "num_channels=3"]),
        (torch.randn(3, 32, 32), ["(3, 32, 32)", "(batch, channels, height, width)"]),
        (torch.randn(0, 3, 32, 32), ["(0, 3, 32, 32)", "batch size 0"]),
        (torch.randn(2, 3, 0, 32), ["(2, 3, 0, 32)", "one patch of 8x8"]),
        (torch.randn(2, 3, 32, 4), ["(2, 3, 32, 4)", "one patch of 8x8"]),
        (torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8), ["torch.uint8", "image processor"]),
        (torch.ones(2, 3, 32, 32, dtype=torch.bool), ["torch.bool", "image processor"]),
    ],
)
def test_bad_inputs_raise_clear_errors(x, words):
    model = make(tiny_config())
    with pytest.raises(ValueError) as error:
        model(x)
    for word in words:
        assert word in str(error.value)


def test_misspelt_keyword_is_an_error():
    model = make(tiny_config())
    with pytest.raises(TypeError, match="output_attention"):
        model(pixels(), output_attention=True)


def test_dynamic_img_pad_pads_bottom_right():
    model = make(tiny_config(dynamic_img_pad=True))
    x = pixels(30, 27)
    with torch.no_grad():
        padded = model(F.pad(x, (0, 5, 0, 2))).logits
        assert torch.equal(model(x).logits, padded)


@pytest.mark.parametrize("patch_size", [None, 5])
def test_an_input_whose_sides_do_not_divide_by_the_patch_loses_its_last_rows_and_columns(patch_size):
    """As a stride-P convolution (timm, big_vision): 35 x 38 pixels in patches of 8 (or 5) give the grid of the
    top-left 32 x 32 (35 x 35) pixels, and the same outputs as that crop, bit for bit."""
    model = make(tiny_config()).eval()
    pixels = torch.randn(2, 3, 35, 38)
    size = patch_size or 8
    crop = pixels[:, :, : 35 // size * size, : 38 // size * size]
    with torch.no_grad():
        assert torch.equal(model(pixels, patch_size=patch_size).logits, model(crop, patch_size=patch_size).logits)


def test_a_native_size_that_does_not_divide_by_the_patch_has_the_floored_grid():
    """SigLIP So400m/14 at 384 px: a 27 x 27 grid, its position table 729 rows (as timm and big_vision)."""
    config = tiny_config(image_size=38, patch_size=8, class_token=False, pooling="mean")
    assert config.grid_size == (4, 4)
    assert make(config).hubvit.embeddings.position_embedding.shape[1] == 16
