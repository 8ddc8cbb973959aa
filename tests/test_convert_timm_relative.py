"""`hubvit convert timm` on timm's relative-bias ViTs, `Beit` (BEiT, BEiT v2) and `VisionTransformerRelPos` (relpos,
srelpos), proven against timm's own forward on the same random weights at the native size (these timm classes run at
their built size only; 1e-5 of the output scale, float32)."""

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
    "relpos_bias_mlp": (
        "vit_relpos_base_patch16_224",
        {},
        dict(position_embedding_type="relative_2d_mlp", class_token=False, pooling="mean", fc_norm=True),
    ),
    "srelpos_shared_bias_mlp_copied_into_every_block": (
        "vit_srelpos_small_patch16_224",
        dict(rel_pos_dim=32),
        dict(position_embedding_type="relative_2d_mlp", relative_position_hidden_size=32),
    ),
    "relpos_residual_post_norm": (
        "vit_relpos_medium_patch16_rpn_224",
        {},
        dict(norm_placement="residual_post", position_embedding_type="relative_2d_mlp"),
    ),
    "relpos_class_token": ("vit_relpos_medium_patch16_cls_224", {}, dict(class_token=True, pooling="cls")),
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_relative_bias_family_matches_timm(family, tmp_path):
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


def test_the_relpos_bias_mlp_gives_every_grid_its_biases_with_nothing_to_resize():
    """timm's RelPosMlp built for another window gives the same biases as hubvit's kind at that grid: the bias is a
    function of the offsets, so a model serves any grid from its stored MLP (float32, same operations: exact)."""
    from timm.layers.pos_embed_rel import RelPosMlp

    from hubvit.modeling.layers_hubvit import HubViTAttention
    from hubvit.modeling.rotary_hubvit import Positions
    from utils import tiny_config

    config = tiny_config(position_embedding_type="relative_2d_mlp", relative_position_hidden_size=16)
    ours = randomize_(HubViTAttention(config, Positions(config)))
    for grid in ((4, 4), (3, 6)):
        theirs = RelPosMlp(window_size=grid, num_heads=config.num_attention_heads, hidden_dim=16, prefix_tokens=1)
        theirs.eval()  # its MLP has dropout (0.125) while training
        with torch.no_grad():
            theirs.mlp.fc1.weight.copy_(ours.relative_position_mlp.fc1.weight)
            theirs.mlp.fc1.bias.copy_(ours.relative_position_mlp.fc1.bias)
            theirs.mlp.fc2.weight.copy_(ours.relative_position_mlp.fc2.weight)
            theirs.mlp.fc2.bias.copy_(ours.relative_position_mlp.fc2.bias)
            expected = theirs.get_bias()
            assert torch.equal(ours.position.logits_bias(ours, grid, 1 + grid[0] * grid[1]), expected)
