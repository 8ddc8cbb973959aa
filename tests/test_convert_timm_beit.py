"""`hubvit convert timm` on timm's `Beit` (BEiT, BEiT v2), proven against timm's own forward on the same random
weights at the native size (timm's Beit runs at its built size only; 1e-5 of the output scale, float32)."""

import pytest
import torch

timm = pytest.importorskip("timm")
from timm.models import save_for_hf  # noqa: E402
from transformers import AutoModelForImageClassification  # noqa: E402

from hubvit.cli import main as cli  # noqa: E402
from utils import randomize_, relative_error  # noqa: E402

TINY = dict(depth=2, embed_dim=64, num_heads=4, img_size=32, patch_size=8, num_classes=5)

# name: (timm architecture, model_args on top of TINY, config fields the family must produce)
FAMILIES = {
    "beit": ("beit_base_patch16_224", {}, dict(position_embedding_type="relative_2d_class", key_bias=False)),
    "beitv2": ("beitv2_base_patch16_224", {}, dict(position_embedding_type="relative_2d_class", fc_norm=True)),
    "shared_relative_bias_copied_into_every_block": (
        "beit_base_patch16_224",
        dict(use_shared_rel_pos_bias=True, use_rel_pos_bias=False),
        dict(position_embedding_type="relative_2d_class"),
    ),
    "absolute_table_class_pooling": (
        "beit_base_patch16_224",
        dict(use_abs_pos_emb=True, use_rel_pos_bias=False, global_pool="token"),
        dict(position_embedding_type="learned", pooling="cls", fc_norm=False),
    ),
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_beit_family_matches_timm(family, tmp_path):
    name, args, expected = FAMILIES[family]
    with torch.no_grad():
        source = randomize_(timm.create_model(name, pretrained=False, **{**TINY, **args}).eval(), seed=len(family))
    save_for_hf(source, tmp_path / "timm", safe_serialization=True)
    assert cli(["convert", "timm", str(tmp_path / "timm"), str(tmp_path / "out")]) == 0
    model, info = AutoModelForImageClassification.from_pretrained(
        tmp_path / "out", trust_remote_code=True, output_loading_info=True
    )
    assert not any(info.values()), info
    for field, value in expected.items():
        assert getattr(model.config, field) == value, (field, getattr(model.config, field))
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert relative_error(model.eval()(pixel_values=pixels).logits, source(pixels)) <= 1e-5


def test_the_class_token_gets_its_three_biases_and_the_patches_theirs():
    """timm's table, one column per head: offsets row-major over (dy, dx), then class-to-patch, patch-to-class and
    class-to-class; hubvit's logits bias reads each where BEiT's index puts it."""
    from timm.models.beit import Attention

    from hubvit.conversion.timm_beit import split_table
    from hubvit.modeling.layers_hubvit import HubViTAttention
    from hubvit.modeling.rotary_hubvit import Positions
    from utils import tiny_config

    grid, heads = (3, 4), 2
    theirs = Attention(dim=16, num_heads=heads, window_size=grid)
    table = torch.randn_like(theirs.relative_position_bias_table)
    with torch.no_grad():
        theirs.relative_position_bias_table.copy_(table)
    config = tiny_config(
        hidden_size=16, num_attention_heads=heads, image_size=[24, 32], position_embedding_type="relative_2d_class"
    )
    ours = HubViTAttention(config, Positions(config))
    offsets, classes = split_table(table, grid)
    with torch.no_grad():
        ours.relative_position_bias.copy_(offsets)
        ours.relative_position_class_bias.copy_(classes)
    expected = theirs._get_rel_pos_bias()
    assert torch.equal(ours.position.logits_bias(ours, grid, 1 + 12), expected)
