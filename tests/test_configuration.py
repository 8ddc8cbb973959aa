"""HubViTConfig's fields are declared once, as typed class annotations with their defaults, and checked against them.

On the installed transformers (5.x, where configs are dataclasses); tests/test_compatibility.py runs the same
config under 4.46 ... 5.24 (`config_facts`: values, depth change, messages for wrong types).
"""

import dataclasses
import inspect
import json

import pytest
from transformers import PretrainedConfig

from hubvit import HubViTConfig

DECLARED = dict(HubViTConfig.__annotations__)
PUBLIC = {name: kind for name, kind in DECLARED.items() if not name.startswith("_")}


def test_every_field_is_declared_with_its_type_and_the_default_the_constructor_uses():
    config = HubViTConfig()
    assert len(PUBLIC) == 68 and {"_out_features", "_out_indices"} <= set(DECLARED)
    assert DECLARED["patch_resize"] == dict | None and DECLARED["semantic_loss_ignore_index"] is int
    assert DECLARED["hidden_size"] is int and HubViTConfig.hidden_size == 768
    assert DECLARED["image_size"] == int | list[int] | tuple[int, int] and HubViTConfig.image_size == 224
    assert DECLARED["qkv_bias"] is bool and DECLARED["final_layer_norm_eps"] == float | None
    signature = inspect.signature(HubViTConfig).parameters
    by_name = {field.name: field for field in dataclasses.fields(HubViTConfig)}
    for name, kind in DECLARED.items():
        default = getattr(HubViTConfig, name)
        assert (by_name[name].type, by_name[name].default) == (kind, default), name
        assert (signature[name].annotation, signature[name].default) == (kind, default), name
        if name in PUBLIC:
            assert getattr(config, name) == default, name
    # out_features=None and out_indices=None (the `_out_*` defaults) mean the last stage
    assert (config.out_features, config.out_indices) == (["stage12"], [12])


def test_the_config_holds_no_field_that_is_not_declared():
    written = set(HubViTConfig(num_labels=3).to_dict())
    base = set(PretrainedConfig().to_dict())
    assert written - base - set(PUBLIC) == {"auto_map", "out_features", "out_indices"}


def test_every_declared_field_is_documented():
    documented = HubViTConfig.__doc__
    assert [name for name in DECLARED if name.lstrip("_") not in documented] == []


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(hidden_size="768"), "hidden_size='768' has type str; expected int"),
        (dict(qkv_bias="yes"), "qkv_bias='yes' has type str; expected bool"),
        (dict(num_hidden_layers=True), "num_hidden_layers=True has type bool; expected int"),
        (dict(num_register_tokens=1.0), "num_register_tokens=1.0 has type float; expected int"),
        (dict(layer_norm_eps="1e-6"), "layer_norm_eps='1e-6' has type str; expected float"),
        (dict(drop_path_rate=None), "drop_path_rate=None has type NoneType; expected float"),
        (dict(final_layer_norm_eps=[1e-6]), "final_layer_norm_eps=[1e-06] has type list; expected float | None"),
        (dict(representation_size=1.5), "representation_size=1.5 has type float; expected int | None"),
        (dict(pooling=None), "pooling=None has type NoneType; expected str"),
        (dict(image_size=True), "image_size=True has type bool; expected int | list[int] | tuple[int, int]"),
        (dict(image_size=(224.0, 224)), "image_size must be an int or an (height, width) pair of ints, got (224.0"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_field_value_and_type(fields, message):
    with pytest.raises(ValueError) as error:
        HubViTConfig(**fields)
    assert message in str(error.value)


def test_an_int_is_a_float_and_pairs_become_lists():
    config = HubViTConfig(layer_norm_eps=1, hidden_dropout_prob=0, image_size=(32, 48), patch_size=[8, 8])
    assert (config.layer_norm_eps, config.hidden_dropout_prob) == (1, 0)
    assert (config.image_size, config.patch_size) == ([32, 48], [8, 8])


def test_positional_arguments_are_refused():
    with pytest.raises(ValueError, match="accepts only keyword arguments"):
        HubViTConfig(224)


def test_a_hand_edited_config_json_of_the_wrong_type_is_refused_on_load(tmp_path):
    HubViTConfig(num_labels=2).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "qkv_bias": "yes"}))
    with pytest.raises(ValueError, match="qkv_bias='yes' has type str; expected bool"):
        HubViTConfig.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="hidden_size='768' has type str; expected int"):
        HubViTConfig.from_dict({**HubViTConfig().to_dict(), "hidden_size": "768"})


@pytest.mark.parametrize("fields", [dict(), dict(num_labels=3, hidden_size=64, num_attention_heads=4, out_indices=[2])])
def test_config_json_holds_every_field_even_at_its_default(tmp_path, fields):
    """transformers 5.24+ leaves default-valued keys out of config.json for the keys its bare base config has; a
    folder saved here must still say everything to a release that knows no annotations (4.46 reads only the file)."""
    config = HubViTConfig(**fields)
    config.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    for name in DECLARED:
        assert written[name.lstrip("_")] == getattr(config, name.lstrip("_")), name
    loaded, saved = HubViTConfig.from_pretrained(tmp_path).to_dict(), config.to_dict()
    assert {k: v for k, v in loaded.items() if k != "_name_or_path"} == {
        k: v for k, v in saved.items() if k != "_name_or_path"
    }


def test_configs_that_differ_in_a_field_are_not_equal():
    assert HubViTConfig(hidden_size=64, num_attention_heads=4) != HubViTConfig()
    assert HubViTConfig(qkv_bias=False) != HubViTConfig() and HubViTConfig() == HubViTConfig()


def test_a_changed_depth_still_moves_the_stages():
    config = HubViTConfig(num_hidden_layers=4, out_indices=[2, 4])
    config.num_hidden_layers = 3
    assert (config.out_features, config.out_indices) == (["stage3"], [3])
    config = HubViTConfig(num_hidden_layers=4)
    config.num_hidden_layers = 6
    assert (config.stage_names[-1], config.out_features, config.out_indices) == ("stage6", ["stage6"], [6])


def test_an_encoder_decoder_flag_is_accepted_while_the_backbone_stages_are_not_yet_set():
    """transformers' validators call `to_dict` inside `__post_init__`, before the backbone's stages exist (its common
    config test passes `is_encoder_decoder=True`); the saved config still names the stages."""
    config = HubViTConfig(is_encoder_decoder=True)
    assert config.is_encoder_decoder and config.to_dict()["out_features"] == ["stage12"]


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            dict(num_key_value_heads=[4, 4], qkv_fused=False),
            "num_key_value_heads=[4, 4] has 2 entries; expected one per block (num_hidden_layers=12) or a single int",
        ),
        (
            dict(num_key_value_heads=5, qkv_fused=False),
            "num_key_value_heads=5; expected counts that divide num_attention_heads=12",
        ),
        (dict(num_key_value_heads=4), "num_key_value_heads=4 groups keys and values; needs qkv_fused=False"),
    ],
)
def test_key_value_head_counts_that_no_attention_can_use_are_refused(fields, message):
    with pytest.raises(ValueError) as error:
        HubViTConfig(**fields)
    assert message in str(error.value)


def test_key_value_heads_are_read_per_block():
    config = HubViTConfig(num_hidden_layers=3, num_key_value_heads=[12, 6, 12], qkv_fused=False)
    assert [config.key_value_heads(i) for i in range(3)] == [12, 6, 12]
    assert HubViTConfig(num_key_value_heads=12).key_value_heads(5) == 12


def test_the_fields_the_model_reads_are_declared_so_no_read_needs_a_fallback():
    """`patch_resize`, `decode_head_pixels` and `semantic_loss_ignore_index` were once read with `getattr(config,
    name, default)`: declared, a config written without them loads with the declared default, and a wrong type is
    refused by name like any field's."""
    config = HubViTConfig.from_dict({"model_type": "hubvit"})
    assert (config.patch_resize, config.decode_head_pixels, config.semantic_loss_ignore_index) == (None, False, 255)
    with pytest.raises(ValueError, match=r"patch_resize=\[8, 8\] has type list; expected dict \| None"):
        HubViTConfig(patch_resize=[8, 8])
