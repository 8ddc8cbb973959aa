"""Rotary position embeddings (`rope_type`), each kind against timm's own rotary module on the same queries and keys.

Tolerance 0: both sides compute the same float32 operations in the same order (angles, sines and cosines of one
layout, the same turn), so the rotated queries and keys agree bit for bit; an order or layout slip shows as O(1).
"""

import pytest
import torch

from hubvit.modeling.rotary_hubvit import ROTARY_KINDS
from utils import tiny_config

timm = pytest.importorskip("timm")
from timm.layers.pos_embed_sincos import (  # noqa: E402
    RotaryEmbeddingCat,
    RotaryEmbeddingDinoV3,
    RotaryEmbeddingMixed,
    apply_rot_embed_cat,
)

HEAD_DIM, HEADS = 16, 2
GRID = (3, 5)  # not square: a swapped axis shows


class Attention(torch.nn.Module):
    """What a rotary kind reads from the attention layer it turns: its training flag, heads and head width."""

    num_heads, head_dim = HEADS, HEAD_DIM


def kind(rope_type, **fields):
    config = tiny_config(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, rope_type=rope_type, **fields)
    return ROTARY_KINDS[rope_type](config)


def timm_turn(x, embed, prefix, half):
    return torch.cat([x[:, :, :prefix], apply_rot_embed_cat(x[:, :, prefix:], embed, half=half)], dim=2)


def queries_and_keys(prefix=1):
    generator = torch.Generator().manual_seed(0)
    shape = (2, HEADS, prefix + GRID[0] * GRID[1], HEAD_DIM)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


CASES = {
    "axial": (
        dict(),
        lambda: RotaryEmbeddingCat(dim=HEAD_DIM, in_pixels=False),
    ),
    "axial_xy_offset_reference_grid": (
        dict(rope_grid_indexing="xy", rope_grid_offset=1.0, rope_reference_grid=[4, 4], rope_temperature=100.0),
        lambda: RotaryEmbeddingCat(
            dim=HEAD_DIM, in_pixels=False, temperature=100.0, grid_indexing="xy", grid_offset=1.0, ref_feat_shape=(4, 4)
        ),
    ),
    "axial_rotate_half": (
        dict(rope_rotate_half=True),
        lambda: RotaryEmbeddingCat(dim=HEAD_DIM, in_pixels=False, rotate_half=True),
    ),
    "dinov3": (dict(), lambda: RotaryEmbeddingDinoV3(dim=HEAD_DIM, temperature=100.0)),
    "dinov3_max_xy": (
        dict(rope_normalize_coords="max", rope_grid_indexing="xy"),
        lambda: RotaryEmbeddingDinoV3(dim=HEAD_DIM, temperature=100.0, normalize_coords="max", grid_indexing="xy"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_rotary_kind_turns_queries_and_keys_as_timm_does(case):
    fields, reference = CASES[case]
    rope_type = case.split("_")[0]
    ours, theirs = kind(rope_type, **fields), reference()
    query, key = queries_and_keys()
    turned = ours.rotate(Attention().eval(), query, key, GRID)
    embed = theirs.get_embed(shape=list(GRID))
    for mine, original in zip(turned, (query, key)):
        assert torch.equal(mine, timm_turn(original, embed, 1, theirs.rotate_half))


def test_rope_mixed_turns_each_head_by_its_own_learned_frequencies_as_timm_does():
    ours = kind("mixed", rope_grid_indexing="xy")
    theirs = RotaryEmbeddingMixed(dim=HEADS * HEAD_DIM, depth=1, num_heads=HEADS, grid_indexing="xy")
    attention = Attention().eval()
    ours.build_attention(attention)
    with torch.no_grad():
        attention.rope_frequencies.copy_(theirs.freqs[:, 0])
    query, key = queries_and_keys()
    turned = ours.rotate(attention, query, key, GRID)
    embed = theirs.get_embed(shape=list(GRID))[0]  # block 0: (H, N, 2 * head_dim)
    for mine, original in zip(turned, (query, key)):
        assert torch.equal(mine, timm_turn(original, embed, 1, False))


@pytest.mark.parametrize("rope_type", ["axial", "dinov3"])
def test_prefix_tokens_are_never_turned(rope_type):
    query, key = queries_and_keys(prefix=5)
    turned_query, turned_key = kind(rope_type).rotate(Attention().eval(), query, key, GRID)
    assert torch.equal(turned_query[:, :, :5], query[:, :, :5]) and torch.equal(turned_key[:, :, :5], key[:, :, :5])
    assert not torch.allclose(turned_query[:, :, 5:], query[:, :, 5:])


def test_a_rotation_keeps_every_vectors_length():
    """A rotation: each pair keeps its norm, so each head vector keeps its length (1e-6: float32 sin/cos)."""
    query, key = queries_and_keys()
    turned, _ = kind("dinov3").rotate(Attention().eval(), query, key, GRID)
    assert torch.allclose(turned.norm(dim=-1), query.norm(dim=-1), rtol=1e-6)


def test_dinov3_augments_coordinates_only_while_training_with_one_draw_per_forward_pass():
    rope = kind("dinov3", rope_shift_coords=0.5, rope_jitter_coords=1.5, rope_rescale_coords=2.0)
    query, key = queries_and_keys()
    attention = Attention()
    plain = rope.rotate(attention.eval(), query, key, GRID)[0]
    assert torch.equal(plain, kind("dinov3").rotate(attention, query, key, GRID)[0])
    attention.train()
    rope.draws = None  # a new forward pass (`Positions.embed` forgets the draws)
    first_block = rope.rotate(attention, query, key, GRID)[0]
    second_block = rope.rotate(attention, query, key, GRID)[0]
    assert torch.equal(first_block, second_block) and not torch.allclose(first_block, plain)
    rope.draws = None
    assert not torch.equal(rope.rotate(attention, query, key, GRID)[0], first_block)


def test_the_model_draws_anew_every_forward_pass_while_training():
    from transformers import set_seed

    from hubvit import HubViTModel

    config = tiny_config(position_embedding_type="none", rope_type="dinov3", rope_rescale_coords=2.0)
    model = HubViTModel(config).train()
    pixels = torch.randn(1, 3, *config.image_size_2d)
    set_seed(0)
    first, second = model(pixels).last_hidden_state, model(pixels).last_hidden_state
    assert not torch.equal(first, second)
    model.eval()
    assert torch.equal(model(pixels).last_hidden_state, model(pixels).last_hidden_state)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(rope_temperature=100.0), "rope_temperature set without rope_type"),
        (dict(rope_type="axial", num_attention_heads=8), "divisible by 4, got 6"),
        (dict(rope_type="spiral"), "rope_type='spiral' is not supported"),
        (dict(rope_type="dinov3", rope_jitter_coords=0.5), "rope_jitter_coords=0.5; expected a finite number >= 1"),
        (dict(rope_type="axial", rope_reference_grid=[4]), "rope_reference_grid=[4]; expected [rows, columns]"),
        (dict(rope_type="mixed", rope_rotate_half=True), "rope_rotate_half=True is not supported"),
    ],
)
def test_a_rotary_setting_no_source_has_is_refused_by_name(fields, message):
    base = dict(hidden_size=48, num_attention_heads=4)
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        tiny_config(**{**base, **fields})


@pytest.mark.parametrize("rope_type", ["axial", "dinov3", "mixed"])
def test_a_rotary_model_exports_to_onnx_and_runs_at_other_resolutions(rope_type, tmp_path):
    """The angles are computed inside the graph from the symbolic grid: onnxruntime and OpenVINO reproduce PyTorch
    at the native size and at larger and non-square ones (the export's own check, 1e-4 of the logit scale)."""
    import hubvit
    from hubvit import HubViTForImageClassification
    from utils import randomize_

    config = tiny_config(rope_type=rope_type, num_labels=3, position_embedding_type="none")
    randomize_(HubViTForImageClassification(config)).save_pretrained(tmp_path / "model")
    result = hubvit.export_onnx(tmp_path / "model", tmp_path / "model.onnx")
    checked = " ".join(result.lines)
    assert "at 48x48" in checked and "at 24x48" in checked, result.lines
