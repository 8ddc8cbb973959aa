"""hubvit.analysis: the arithmetic of "Vision Transformer (ViT) from First Principles" (`hubvit info`) and analyses (`hubvit analyze`).

The document's figures are written here as the document states them; parameter and MAC totals are checked against
the real model (`sum(p.numel())`, `torch.utils.flop_counter.FlopCounterMode`), attention distances against closed
forms, rollout against hand computations.
"""

import json
import math

import numpy as np
import pytest
import skimage.data
import torch
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

from hubvit import HubViTForImageClassification, HubViTModel
from hubvit.analysis import attention, info, position
from hubvit import cli
from utils import SAM_PARTS, randomize_, tiny_config

# Variants that change the parameter and MAC counts: every term of the arithmetic is exercised by one of them.
VARIANTS = {
    "paper": {},
    "no_prefix_row": dict(position_embedding_includes_prefix=False, num_register_tokens=2),
    "learned_2d": dict(position_embedding_type="learned_2d", qkv_bias=False, patch_bias=False),
    "relative_2d": dict(position_embedding_type="relative_2d", layer_scale_init_value=0.1),
    "sincos_2d_map": dict(position_embedding_type="sincos_2d", class_token=False, pooling="map"),
    "distilled": dict(distillation_token=True),
    "cls_mean_pre_norm_pre_logits": dict(
        pooling="cls_mean", pre_norm=True, image_size=[32, 48], representation_size=24
    ),
    "mean_fc_norm_no_head": dict(pooling="mean", class_token=False, fc_norm=True, num_labels=0),
    "gated_rms_qk_norm": dict(mlp_type="gated", hidden_act="silu", norm_type="rms_norm", qk_norm=True, pre_norm=True),
    "q_and_v_biases_no_mlp_bias": dict(
        key_bias=False, mlp_bias=False, proj_bias=False, pooling="map", class_token=False
    ),
    "separate_qkv_without_key_bias": dict(qkv_fused=False, key_bias=False, mlp_type="gated"),
    "grouped_key_value_heads_per_block": dict(qkv_fused=False, num_key_value_heads=[1, 2]),
    "beit_relative_bias": dict(position_embedding_type="relative_2d_class", key_bias=False),
    "residual_post_norm": dict(norm_placement="residual_post", layer_scale_init_value=0.5),
    "attention_only_layer_scale": dict(layer_scale_init_value=0.5, scale_attention_branch_only=True),
    "relpos_bias_mlp": dict(position_embedding_type="relative_2d_mlp", relative_position_hidden_size=24),
    "eva02_rotary_inner_norms": dict(
        rope_type="axial",
        mlp_type="gated",
        mlp_inner_norm=True,
        attention_inner_norm=True,
        fc_norm=True,
        pooling="mean",
    ),
    "rope_mixed_learned_frequencies": dict(rope_type="mixed", position_embedding_type="none"),
    "sam_windows_decomposed_positions_neck": SAM_PARTS,
    "patch_norm_no_final_norm_map_of_its_own": dict(
        patch_norm=True, final_norm=False, pooling="map", map_num_heads=2, map_intermediate_size=40
    ),
}


def eager_classifier(config, seed=0):
    model = HubViTForImageClassification._from_config(config, attn_implementation="eager")
    return randomize_(model, seed).eval()


# hubvit info: the numbers of "ViT from First Principles"


def test_vit_b16_at_224_gives_the_documents_token_and_attention_figures():
    config = info.preset_config("b/16")
    summary = info.summary(config, batch_size=1, dtype="float16")
    assert summary["grid"] == [14, 14] and summary["num_patches"] == 196
    assert summary["sequence_length"] == 197
    assert summary["attention"]["patches"]["entries_per_head"] == 38_809
    assert round(summary["attention"]["reduction"]) == 64_872
    # one layer of pixel-level attention scores: 12 heads, fp16, batch 1, "about 60.4 GB"
    assert round(summary["attention"]["pixels"]["bytes_per_layer"] / 1e9, 1) == 60.4


def test_vit_b16_parameters_and_macs_are_the_documents():
    summary = info.summary(info.preset_config("b/16"))
    assert summary["parameters"]["total"] == 86_567_656
    assert round(summary["macs_per_image"]["forward"] / 1e9, 1) == 17.6


def test_vit_b16_parameter_total_equals_the_real_model():
    config = info.preset_config("b/16")
    model = HubViTForImageClassification(config)
    assert info.summary(config)["parameters"]["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_parameter_parts_sum_to_the_real_model(variant):
    config = tiny_config(**{"num_labels": 5, **VARIANTS[variant]})
    model = HubViTForImageClassification(config)
    assert sum(dict(info.parameter_parts(config)).values()) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_forward_macs_agree_with_flop_counter(variant):
    """FlopCounterMode counts 2 FLOPs per multiply-accumulate of matrix products and convolutions."""
    config = tiny_config(**{"num_labels": 5, **VARIANTS[variant]})
    model = eager_classifier(config)
    pixels = torch.randn(1, 3, *config.image_size_2d)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(pixels)
    assert counter.get_total_flops() == info.summary(config)["macs_per_image"]["forward_flops"]


def test_macs_at_another_image_size_agree_with_flop_counter():
    config = tiny_config(num_labels=5)
    model = eager_classifier(config)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(1, 3, 48, 64))
    assert counter.get_total_flops() == 2 * info.summary(config, image_size=(48, 64))["macs_per_image"]["forward"]


def test_training_step_macs_agree_with_flop_counter():
    config = tiny_config(num_labels=5)
    model = eager_classifier(config).train()
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(1, 3, 32, 32)).logits.sum().backward()
    assert counter.get_total_flops() == info.summary(config)["macs_per_image"]["training_step_flops"]


TIMM_BUILDS = [
    "paper",
    "no_prefix_row",
    "mean_fc_norm_no_head",
    "grouped_key_value_heads_per_block",
    "attention_only_layer_scale",
    "rope_mixed_learned_frequencies",
]


@pytest.mark.parametrize("variant", TIMM_BUILDS)
def test_parameters_and_macs_equal_timms_count_of_the_same_architecture(variant):
    """The peer's count: timm's model for the same config (the one `hubvit export timm` builds), its parameters and
    FlopCounterMode's count of its forward with timm's unfused attention, whose two products the counter sees."""
    import timm

    from hubvit.conversion.export_timm import family_build

    config = tiny_config(**{"num_labels": 5, **VARIANTS[variant]})
    _, _, peer = family_build(timm, config)
    for module in peer.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        peer(torch.randn(1, 3, *config.image_size_2d))
    summary = info.summary(config)
    assert summary["parameters"]["total"] == sum(p.numel() for p in peer.parameters())
    assert summary["macs_per_image"]["forward_flops"] == counter.get_total_flops()


def test_patch_size_rows_grow_tokens_and_macs_with_fixed_encoder():
    rows = info.patch_size_rows(info.preset_config("b/16"), [32, 16, 14, 8])
    assert [r["num_patches"] for r in rows] == [7 * 7, 14 * 14, 16 * 16, 28 * 28]
    assert len({r["encoder_parameters"] for r in rows}) == 1
    macs = [r["forward_macs"] for r in rows]
    memory = [r["attention_bytes_all_layers"] for r in rows]
    assert macs == sorted(macs) and memory == sorted(memory)


# attention distance


def test_identity_attention_has_zero_distance():
    grid, tokens = (4, 5), 1 + 20
    eye = torch.eye(tokens).expand(2, 3, tokens, tokens)
    distance, prefix = attention.mean_distance(eye, attention.patch_distances(grid, (16, 16)))
    assert torch.equal(distance, torch.zeros(2, 3)) and torch.equal(prefix, torch.zeros(2, 3))


def test_uniform_distance_closed_form_on_a_2x2_grid():
    # pairs of a 2x2 grid: 4 at distance 0, 8 at one patch, 4 at a diagonal; mean (8 P + 4 sqrt(2) P) / 16
    assert attention.uniform_distance((2, 2), (16, 16)) == pytest.approx(8 + 4 * math.sqrt(2), rel=1e-12)


def test_uniform_attention_gives_the_closed_form():
    """Uniform over every token, [CLS] included: renormalised over the patches it is uniform over the grid."""
    grid, tokens = (6, 7), 1 + 42
    uniform = torch.full((1, 2, tokens, tokens), 1.0 / tokens)
    distance, prefix = attention.mean_distance(uniform, attention.patch_distances(grid, (16, 8)))
    expected = attention.uniform_distance(grid, (16, 8))
    torch.testing.assert_close(distance, torch.full((1, 2), expected), rtol=1e-6, atol=0)  # float32 sums of 1,806 terms
    torch.testing.assert_close(prefix, torch.full((1, 2), 1.0 / tokens))


def relative_model(local_strength):
    """Attention decided by the relative 2D bias alone: q = k = 0, bias = -strength x distance in patches."""
    config = tiny_config(image_size=64, patch_size=8, position_embedding_type="relative_2d")
    model = HubViTModel._from_config(config, attn_implementation="eager")
    randomize_(model)
    dy, dx = torch.meshgrid(torch.arange(-7, 8.0), torch.arange(-7, 8.0), indexing="ij")
    with torch.no_grad():
        for layer in model.encoder.layers:
            layer.attention.qkv.weight[: 2 * config.hidden_size].zero_()
            layer.attention.qkv.bias[: 2 * config.hidden_size].zero_()
            layer.attention.relative_position_bias.copy_(-local_strength * torch.hypot(dy, dx).expand(4, -1, -1))
    return model.eval()


def photo_batches(size, count=3, batch_size=2):
    photos = [skimage.data.astronaut(), skimage.data.chelsea(), skimage.data.coffee()][:count]
    tensors = [torch.from_numpy(np.array(Image.fromarray(p).resize((size, size)))).permute(2, 0, 1) for p in photos]
    pixels = (torch.stack(tensors).float() / 127.5) - 1.0
    return list(pixels.split(batch_size))


def test_uniform_model_measures_the_closed_form():
    result = attention.attention_distance(relative_model(0.0), photo_batches(64))
    expected = attention.uniform_distance((8, 8), (8, 8))
    np.testing.assert_allclose(result["mean_distance"], expected, rtol=1e-5)
    assert result["images"] == 3 and result["uniform_attention_distance"] == expected


def test_local_relative_bias_measures_smaller_than_uniform():
    uniform = np.asarray(attention.attention_distance(relative_model(0.0), photo_batches(64))["mean_distance"])
    local = np.asarray(attention.attention_distance(relative_model(3.0), photo_batches(64))["mean_distance"])
    assert (local < 0.5 * uniform).all()


def test_streaming_reduction_does_not_depend_on_the_batching():
    model = randomize_(HubViTModel(tiny_config())).eval()
    one = attention.attention_distance(model, photo_batches(32, batch_size=1))
    whole = attention.attention_distance(model, photo_batches(32, batch_size=3))
    np.testing.assert_allclose(one["mean_distance"], whole["mean_distance"], rtol=1e-5)


def test_model_attention_path_has_the_fused_paths_hidden_states():
    """The weights come from `output_attentions=True` (eager); its forward must be the default (sdpa) one."""
    model = randomize_(HubViTModel._from_config(tiny_config(), attn_implementation="sdpa")).eval()
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        fused = model(pixels, output_hidden_states=True)
        eager = model(pixels, output_hidden_states=True, output_attentions=True)
    assert fused.attentions is None and len(eager.attentions) == 2
    scale = fused.last_hidden_state.abs().max()
    for a, b in zip(fused.hidden_states, eager.hidden_states):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * float(scale))


# attention rollout and maps


def test_rollout_of_a_two_layer_uniform_model_by_hand():
    """q = k = 0 makes every head uniform, A = J/T. With A' = (I + A)/2 per layer, A'A' = I/4 + 3J/(4T): [CLS]
    gives each of the 4 patches 3/(4 x 5)."""
    config = tiny_config(image_size=16, patch_size=8, num_hidden_layers=2)
    model = randomize_(HubViTModel(config)).eval()
    with torch.no_grad():
        for layer in model.encoder.layers:
            layer.attention.qkv.weight[: 2 * config.hidden_size].zero_()
            layer.attention.qkv.bias[: 2 * config.hidden_size].zero_()
    attentions, grid = attention.attention_weights(model, torch.randn(1, 3, 16, 16))
    assert grid == (2, 2)
    torch.testing.assert_close(attention.rollout(attentions, 1), torch.full((1, 4), 3 / 20))


def test_rollout_averages_heads_and_multiplies_later_layers_on_the_left():
    """Layer 1: every token reads token 2; layer 2: every token reads token 1 (and in layer 1 a second head is the
    identity, so the mean is (I + A)/2 before the identity is added).

    Layer 1: A'_1 = (I + (I + e2)/2) / 2, row 0 = [3/4, 0, 1/4]; row 1 = [0, 3/4, 1/4]; row 2 = [0, 0, 1].
    Layer 2: A'_2 = (I + e1) / 2, row 0 = [1/2, 1/2, 0]. Rollout row 0 = (row 0 + row 1 of A'_1) / 2 = [3/8, 3/8, 1/4].
    """
    to_2, to_1 = torch.zeros(3, 3), torch.zeros(3, 3)
    to_2[:, 2], to_1[:, 1] = 1, 1
    layer1 = torch.stack([to_2, torch.eye(3)])[None]
    layer2 = torch.stack([to_1, to_1])[None]
    torch.testing.assert_close(attention.rollout([layer1, layer2], 1), torch.tensor([[3 / 8, 1 / 4]]))


def test_rollout_without_class_token_starts_from_the_mean_patch_query():
    uniform = torch.full((1, 1, 4, 4), 0.25)
    # one layer: A' = (I + J/4)/2; patch rows mean to [1/8, 1/8, 1/8, 1/8] + [0, 1/6, 1/6, 1/6] (the identity part)
    expected = torch.full((1, 3), 1 / 8) + 1 / 6
    torch.testing.assert_close(attention.rollout([uniform], 1, class_token=False), expected)


def test_last_layer_map_reads_one_head_or_their_mean():
    last = torch.stack([torch.eye(3), torch.full((3, 3), 1 / 3)])[None]
    torch.testing.assert_close(attention.last_layer_map([last], 1, head=1), torch.full((1, 2), 1 / 3))
    torch.testing.assert_close(attention.last_layer_map([last], 1), torch.full((1, 2), 1 / 6))
    with pytest.raises(ValueError, match="head 2 does not exist"):
        attention.last_layer_map([last], 1, head=2)


# position similarity


def test_similarity_tiles_are_one_at_their_own_patch():
    model = randomize_(HubViTModel(tiny_config(image_size=48)))
    similarity = position.cosine_similarity_grid(position.position_table(model), (6, 6))
    own = similarity.reshape(36, 36).diagonal()
    torch.testing.assert_close(own, torch.ones(36))


def stripe_score_of(**overrides):
    model = randomize_(HubViTModel(tiny_config(image_size=96, patch_size=8, num_hidden_layers=1, **overrides)))
    return position.stripe_score(position.cosine_similarity_grid(position.position_table(model), (12, 12)))


def test_stripe_score_is_one_half_for_random_row_and_column_tables():
    """learned_2d is [row vector, column vector]: with random 512-wide halves (cosine about 0 between different rows)
    a same-row pair shares half the vector (similarity 1/2), an off-axis pair nothing. Tolerance: 0.03, a few
    standard deviations of the random cosines (1/sqrt(512) = 0.044 per pair) averaged over hundreds of pairs."""
    assert stripe_score_of(hidden_size=1024, position_embedding_type="learned_2d") == pytest.approx(0.5, abs=0.03)


def test_stripe_score_is_about_zero_for_a_random_table():
    """A random 1D table has no rows or columns: 0 up to the noise of random cosines (see above)."""
    assert abs(stripe_score_of(hidden_size=1024)) < 0.02


def test_stripe_score_is_positive_for_sincos():
    """[sin x, cos x, sin y, cos y]: same-row pairs share the y half exactly. Most of big_vision's frequencies are low
    (cosines near 1 for every offset), so the margin is small but positive."""
    assert stripe_score_of(hidden_size=64, position_embedding_type="sincos_2d") > 0.03


@pytest.mark.parametrize("rope", [dict(rope_type="dinov3"), dict(rope_type="axial"), dict(rope_type="mixed")])
def test_rotary_similarity_is_what_the_rotation_does_to_a_query_key_product(rope):
    """The rotary table's cosine similarity of patches i and j equals <R_i u, R_j u> / |u|^2 for a vector u whose
    pairs all have the same norm, rotated by the model's own attention layer (block 0; mixed: every head's product
    averaged): the map is what the rotation alone does to attention. float32 sums of 8 to 32 terms: 1e-5."""
    config = tiny_config(image_size=48, patch_size=8, num_hidden_layers=1, position_embedding_type="none", **rope)
    model = randomize_(HubViTModel(config)).eval()
    layer = model.encoder.layers[0].attention
    heads, head_dim, grid = config.num_attention_heads, config.hidden_size // config.num_attention_heads, (6, 6)
    ones = torch.ones(1, heads, 1 + 36, head_dim)
    query, key = layer.position.rotate(layer, ones, ones, grid)
    products = (query[:, :, 1:] @ key[:, :, 1:].transpose(-1, -2)).mean(dim=(0, 1)) / head_dim
    similarity = position.cosine_similarity_grid(position.rotary_table(model), grid)
    torch.testing.assert_close(similarity.reshape(36, 36), products, atol=1e-5, rtol=0)


def test_rotary_stripe_score_is_positive_for_axis_separable_rotations():
    """DINOv3 turns half the pairs by the row and half by the column, so a same-row pair keeps the row half's
    product whole (cos 0 = 1), an off-axis pair at the same distance loses some of both halves."""
    config = tiny_config(
        image_size=96, patch_size=8, num_hidden_layers=1, position_embedding_type="none", rope_type="dinov3"
    )
    model = HubViTModel(config)
    assert position.stripe_score(position.cosine_similarity_grid(position.rotary_table(model), (12, 12))) > 0.03


def test_rotary_table_is_none_without_a_rotation():
    assert position.rotary_table(HubViTModel(tiny_config())) is None


@pytest.mark.parametrize("grid", [(7, 7), (14, 14)])
def test_stripe_score_is_zero_for_a_table_that_depends_on_distance_only(grid):
    """A table whose Gram matrix is a Gaussian of the patch distance (its Cholesky factor): every cosine is a function
    of distance alone, so no row or column stands out. 0 to 0.01 is the scale of a stripe; the float64 similarities
    leave only the Cholesky round-off of a kernel with 1e-6 added to its diagonal (about 1e-16)."""
    table = position.distance_only_table(grid)
    dy, dx = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    distance = (dy.reshape(-1, 1) - dy.reshape(1, -1)).square() + (dx.reshape(-1, 1) - dx.reshape(1, -1)).square()
    gram = table @ table.t()
    assert torch.allclose(gram, torch.exp(-distance.double() / 8.0) + 1e-6 * torch.eye(len(table)), atol=1e-12)
    score = position.stripe_score(position.cosine_similarity_grid(table, grid))
    assert abs(score) < 1e-12


def test_learned_table_resized_to_another_image_size():
    model = randomize_(HubViTModel(tiny_config()))
    assert position.position_table(model, (6, 5)).shape == (30, 32)


def test_relative_bias_tables_and_no_table():
    model = HubViTModel(tiny_config(position_embedding_type="relative_2d"))
    assert position.relative_bias_tables(model, layer=1).shape == (4, 7, 7)
    assert position.position_table(HubViTModel(tiny_config(position_embedding_type="none"))) is None


# the command line


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    randomize_(HubViTForImageClassification(tiny_config(num_labels=3))).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    for name in ("astronaut", "chelsea", "coffee"):
        Image.fromarray(getattr(skimage.data, name)()).resize((64, 48)).save(folder / f"{name}.png")
    return folder


def decodes(path):
    with Image.open(path) as image:
        image.load()
        return image.size[0] > 100 and image.size[1] > 100


def test_cli_attention_distance_writes_decodable_png_json_and_csv(model_folder, photo_folder, tmp_path):
    code = cli.main(
        [
            "analyze",
            "attention-distance",
            str(model_folder),
            "--images",
            str(photo_folder),
            "--batch-size",
            "2",
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert code == 0 and decodes(tmp_path / "attention_distance.png")
    result = json.loads((tmp_path / "attention_distance.json").read_text())
    assert result["images"] == 3 and np.asarray(result["mean_distance"]).shape == (2, 4)
    rows = (tmp_path / "attention_distance.csv").read_text().splitlines()
    assert rows[0] == "layer,head_0,head_1,head_2,head_3" and len(rows) == 3


def test_cli_attention_distance_refuses_a_loading_script_in_one_line(model_folder, tmp_path, capsys):
    """Issue 50: `hubvit analyze` ended in datasets' RuntimeError traceback where `hubvit train` said what to give."""
    folder = tmp_path / "digits"
    folder.mkdir()
    (folder / "digits.py").write_text("import datasets\n")
    argv = ["analyze", "attention-distance", str(model_folder), "--dataset", str(folder), "--output-dir", str(tmp_path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--dataset" in err and "digits.py is a datasets loading script" in err and "Traceback" not in err


def test_cli_attention_distance_reads_a_saved_dataset(model_folder, photo_folder, tmp_path):
    import datasets

    photos = [Image.open(path).convert("RGB") for path in sorted(photo_folder.glob("*.png"))]
    data = datasets.Dataset.from_dict({"picture": photos}, features=datasets.Features({"picture": datasets.Image()}))
    data.save_to_disk(str(tmp_path / "saved"))
    code = cli.main(
        [
            "analyze",
            "attention-distance",
            str(model_folder),
            "--dataset",
            str(tmp_path / "saved"),
            "--image-column",
            "picture",
            "--max-images",
            "2",
            "--output-dir",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0 and json.loads((tmp_path / "out" / "attention_distance.json").read_text())["images"] == 2


def test_cli_position_similarity_of_a_rotary_model_draws_the_rotation_and_the_table(tmp_path, capsys):
    """EVA-02's layout (a learned table and an axial rotation): both figures, each with its stripe score."""
    folder = tmp_path / "model"
    HubViTModel(tiny_config(image_size=64, patch_size=8, rope_type="axial")).save_pretrained(folder)
    assert cli.main(["analyze", "position-similarity", str(folder), "--output-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "rotary_similarity.png; rotary stripe score" in out and "position_similarity.png; stripe score" in out
    assert decodes(tmp_path / "out" / "rotary_similarity.png")
    assert np.load(tmp_path / "out" / "rotary_similarity.npy").shape == (8, 8, 8, 8)


def test_cli_position_similarity_and_attention_map(model_folder, photo_folder, tmp_path, capsys):
    assert cli.main(["analyze", "position-similarity", str(model_folder), "--output-dir", str(tmp_path)]) == 0
    assert "stripe score" in capsys.readouterr().out
    assert decodes(tmp_path / "position_similarity.png")
    assert np.load(tmp_path / "position_similarity.npy").shape == (4, 4, 4, 4)
    image = str(photo_folder / "chelsea.png")
    assert cli.main(["analyze", "attention-map", str(model_folder), image, "--output-dir", str(tmp_path)]) == 0
    assert (
        cli.main(
            [
                "analyze",
                "attention-map",
                str(model_folder),
                image,
                "--method",
                "last-layer",
                "--head",
                "1",
                "--output-dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert decodes(tmp_path / "attention_map_chelsea_rollout.png")
    assert decodes(tmp_path / "attention_map_chelsea_last-layer.png")


def test_cli_info_json_on_a_folder_counts_the_saved_model(model_folder, capsys):
    assert cli.main(["info", str(model_folder), "--json", "--patch-sizes", "4,8"]) == 0
    printed = json.loads(capsys.readouterr().out)
    model = HubViTForImageClassification.from_pretrained(model_folder)
    assert printed["parameters"]["total"] == sum(p.numel() for p in model.parameters())
    assert [row["num_patches"] for row in printed["patch_sizes"]] == [64, 16]


def test_cli_info_counts_a_body_only_folder_without_a_head(tmp_path, capsys):
    model = HubViTModel(tiny_config(representation_size=24))
    model.save_pretrained(tmp_path)
    assert cli.main(["info", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"]["total"] == sum(p.numel() for p in model.parameters())


def test_cli_info_table_names_the_reduction(capsys):
    assert cli.main(["info", "b/16", "--dtype", "float16"]) == 0
    assert "64,872x more attention entries" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["info", "b/16", "--image-size", "10"], "smaller than one patch"),
        (["info", "b/16", "--dtype", "int8"], "dtype 'int8' is not supported"),
        (["info", "b/16", "--patch-sizes", "16,15"], "patch size 15 does not divide"),
    ],
)
def test_cli_bad_values_fail_with_one_line(argv, message, capsys):
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1


def test_cli_position_similarity_draws_relative_bias_per_head(tmp_path):
    folder = tmp_path / "model"
    randomize_(HubViTModel(tiny_config(position_embedding_type="relative_2d"))).save_pretrained(folder)
    assert (
        cli.main(
            [
                "analyze",
                "position-similarity",
                str(folder),
                "--layer",
                "1",
                "--image-size",
                "48",
                "--output-dir",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    assert decodes(tmp_path / "out" / "relative_position_bias.png")
    assert np.load(tmp_path / "out" / "relative_position_bias.npy").shape == (4, 11, 11)  # 6x6 grid at 48


def test_cli_attention_map_refuses_a_file_that_is_not_an_image(model_folder, tmp_path, capsys):
    (tmp_path / "notes.png").write_text("not an image")
    assert (
        cli.main(
            ["analyze", "attention-map", str(model_folder), str(tmp_path / "notes.png"), "--output-dir", str(tmp_path)]
        )
        == 2
    )
    assert "cannot read" in capsys.readouterr().err


def test_cli_position_similarity_says_when_there_is_no_table(tmp_path, capsys):
    folder = tmp_path / "model"
    HubViTModel(tiny_config(position_embedding_type="none")).save_pretrained(folder)
    assert cli.main(["analyze", "position-similarity", str(folder), "--output-dir", str(tmp_path / "out")]) == 0
    assert "no position table" in capsys.readouterr().out


@pytest.mark.heavy
def test_cli_reads_a_hub_repo_id(hub_server, model_folder, photo_folder, tmp_path, capsys):
    """SRC as a Hub repo id, through huggingface_hub against the local Hub server (tests/hub_server.py)."""
    from huggingface_hub import HfApi

    repo_id = f"{hub_server.user}/tiny-analysis"
    api = HfApi()
    api.create_repo(repo_id)
    api.upload_folder(folder_path=str(model_folder), repo_id=repo_id)
    assert cli.main(["info", repo_id, "--json"]) == 0
    model = HubViTForImageClassification.from_pretrained(model_folder)
    assert json.loads(capsys.readouterr().out)["parameters"]["total"] == sum(p.numel() for p in model.parameters())
    assert (
        cli.main(["analyze", "attention-map", repo_id, str(photo_folder / "coffee.png"), "--output-dir", str(tmp_path)])
        == 0
    )
    assert decodes(tmp_path / "attention_map_coffee_rollout.png")


@pytest.mark.parametrize("size", [(32, 32), (48, 48), (32, 48)])
def test_a_cropping_processor_gives_the_requested_size(size):
    """A converted timm folder carries a resize-then-crop processor; analysis at another size still feeds `size`."""
    from hubvit.analysis.source import preprocess
    from hubvit.conversion.preprocessing import from_timm

    processor, _ = from_timm(dict(input_size=(3, 32, 32), crop_pct=0.875, interpolation="bicubic"))
    photo = Image.fromarray(skimage.data.chelsea())
    assert preprocess(processor, [photo], size).shape == (1, 3, *size)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({}, "learned 1D table"),
        (dict(position_embedding_type="none", rope_type="dinov3"), "rotary, patch centres in [-1, 1] (DINOv3)"),
        (dict(rope_type="axial"), "learned 1D table, one row per token (the paper's default) + rotary, integer"),
    ],
)
def test_info_says_what_the_model_is_told_about_where_patches_sit(fields, said):
    assert info.summary(tiny_config(**fields))["position"].startswith(said)
