"""The recipe flags: what each one changes (EMA, augmentation, random erasing, drop path, bf16 autocast,
torch.compile, presets). The flags of the training step, the optimizer and the schedule: test_recipe_steps.py."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torchvision.transforms import v2
from utils import randomize_, tiny_config

from hubvit.training import ema, recipes


@pytest.fixture
def fresh_accelerate():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def tiny_model(**overrides):
    from hubvit import HubViTForImageClassification

    torch.manual_seed(0)
    model = HubViTForImageClassification(tiny_config(num_labels=3, **overrides))
    randomize_(model)
    return model


def test_ema_first_update_copies_then_averages_with_the_decay():
    model = tiny_model()
    averaged = ema.model_ema(model, decay=0.9)
    ema.update_ema(averaged, model)
    first = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update_ema(averaged, model)
    for name, value in averaged.module.state_dict().items():
        now = model.state_dict()[name]
        expected = 0.9 * first[name] + 0.1 * now if first[name].is_floating_point() else first[name]
        torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5])
def test_ema_decay_outside_the_open_unit_interval_is_refused(decay):
    with pytest.raises(ema.EMAError, match=f"--ema_decay must be in \\(0, 1\\), got {decay}"):
        ema.model_ema(tiny_model(), decay)


def test_random_erasing_replaces_one_rectangle_and_nothing_else():
    base = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    image = torch.full((3, 16, 16), 0.25)
    assert recipes.with_random_erasing(base, 0.0) is base
    erased = recipes.with_random_erasing(base, 1.0)
    torch.manual_seed(0)
    out = erased(image)
    changed = (out != image).any(0)
    rows, cols = changed.any(1).nonzero().flatten(), changed.any(0).nonzero().flatten()
    assert 0 < changed.sum() < 16 * 16
    assert changed.sum() == len(rows) * len(cols), "the erased pixels form one rectangle"
    assert changed[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1].all()


def test_drop_path_rate_grows_linearly_and_makes_training_forwards_random():
    model = tiny_model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    pixels = torch.randn(4, 3, *model.config.image_size_2d)
    model.train()
    torch.testing.assert_close(model(pixel_values=pixels).logits, model(pixel_values=pixels).logits)
    recipes.set_drop_path_rate(model, 0.3)
    depth = model.config.num_hidden_layers
    assert [layer.drop_path_rate for layer in model.hubvit.encoder.layers] == pytest.approx(
        [0.3 * i / (depth - 1) for i in range(depth)]
    )
    assert model.config.drop_path_rate == 0.3
    torch.manual_seed(1)
    assert not torch.allclose(model(pixel_values=pixels).logits, model(pixel_values=pixels).logits)
    model.eval()
    torch.testing.assert_close(model(pixel_values=pixels).logits, model(pixel_values=pixels).logits)


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("no", torch.float32)])
def test_mixed_precision_bf16_autocasts_the_encoder_on_cpu(fresh_accelerate, precision, dtype):
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision=precision, cpu=True)
    model = accelerator.prepare(tiny_model())
    seen = []
    model.hubvit.encoder.layers[0].mlp.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    model(pixel_values=torch.randn(2, 3, *model.config.image_size_2d))
    assert seen == [dtype]


def test_torch_compile_flag_compiles_the_prepared_model_and_keeps_its_outputs(fresh_accelerate, tmp_path):
    from hubvit.training import make_accelerator, parse_args

    args = parse_args(["--output_dir", str(tmp_path), "--torch_compile", "eager"])
    args.gradient_accumulation_steps, args.mixed_precision = 1, "no"
    model = tiny_model().eval()
    pixels = torch.randn(2, 3, *model.config.image_size_2d)
    eager = model(pixel_values=pixels).logits
    prepared = make_accelerator(args).prepare(model)
    assert isinstance(prepared, torch._dynamo.eval_frame.OptimizedModule)
    torch.testing.assert_close(prepared(pixel_values=pixels).logits, eager, rtol=1e-5, atol=1e-6)


# The published values each preset must carry (sources in hubvit/training/recipes.py).
PUBLISHED = {
    "deit": {
        "optimizer": "adamw",
        "weight_decay": 0.05,
        "label_smoothing": 0.1,
        "mixup_alpha": 0.8,
        "cutmix_alpha": 1.0,
        "random_erasing": 0.25,
        "drop_path_rate": 0.1,
        "ema_decay": 0.99996,
        "randaugment_magnitude": 9,
    },
    "augreg": {"optimizer": "sgd", "momentum": 0.9, "weight_decay": 0.0, "max_grad_norm": 1.0, "mixup_alpha": 0.0},
    "mae": {
        "optimizer": "adamw",
        "layer_decay": 0.65,
        "weight_decay": 0.05,
        "mixup_alpha": 0.8,
        "cutmix_alpha": 1.0,
        "drop_path_rate": 0.1,
        "random_erasing": 0.25,
        "label_smoothing": 0.1,
    },
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_set_their_published_values_unless_the_user_typed_a_flag(name):
    args = SimpleNamespace()
    applied = recipes.apply_recipe(args, name, explicit={"weight_decay"}, global_batch=1024)
    for key, value in PUBLISHED[name].items():
        if key != "weight_decay":
            assert getattr(args, key) == value, key
    assert not hasattr(args, "weight_decay") and "weight_decay" not in applied


def test_batch_scaled_learning_rates_follow_their_reference_batch():
    deit, mae, augreg = SimpleNamespace(), SimpleNamespace(), SimpleNamespace()
    recipes.apply_recipe(deit, "deit", set(), global_batch=1024)
    recipes.apply_recipe(mae, "mae", set(), global_batch=1024)
    recipes.apply_recipe(augreg, "augreg", set(), global_batch=1024)
    assert deit.learning_rate == pytest.approx(5e-4 * 1024 / 512)
    assert mae.learning_rate == pytest.approx(5e-4 * 1024 / 256)
    assert augreg.learning_rate == 0.03


def test_an_unknown_recipe_is_refused_with_the_names():
    with pytest.raises(recipes.RecipeError, match="'timm' is not one of augreg, deit, mae"):
        recipes.apply_recipe(SimpleNamespace(), "timm", set(), 64)


def test_a_run_with_ema_evaluates_and_saves_the_average_beside_the_model(tmp_path):
    from safetensors.torch import load_file
    from test_finetune import TINY_MODEL, results, run_in_process, saved_dataset

    data = saved_dataset(tmp_path / "data", n=24)
    out = tmp_path / "out"
    assert (
        run_in_process(
            [
                "--dataset_name",
                str(data),
                "--image_column_name",
                "img",
                "--label_column_name",
                "target",
                *TINY_MODEL,
                "--per_device_train_batch_size",
                "4",
                "--max_train_steps",
                "4",
                "--ema_decay",
                "0.5",
                "--output_dir",
                str(out),
            ]
        )
        == 0
    )
    found = results(out)
    assert {"ema_eval_accuracy", "ema_eval_loss"} <= set(found)
    model, averaged = load_file(out / "model" / "model.safetensors"), load_file(out / "model_ema" / "model.safetensors")
    assert model.keys() == averaged.keys()
    assert any(not torch.equal(model[k], averaged[k]) for k in model)


@pytest.mark.parametrize(
    "flag, value, expected",
    [
        ("--random_erasing", "1.5", "--random_erasing must be a finite number in [0, 1], got 1.5"),
        ("--ema_decay", "1", "--ema_decay must be a finite number in (0, 1), got 1.0"),
        ("--drop_path_rate", "nan", "--drop_path_rate must be a finite number in [0, 1), got nan"),
        ("--shuffle_buffer", "-1", "--shuffle_buffer must be >= 0, got -1"),
    ],
)
def test_bad_recipe_values_fail_before_training_with_the_value(tmp_path, capsys, flag, value, expected):
    from hubvit.cli.finetune import main

    with pytest.raises(SystemExit) as exit_:
        main(["--output_dir", str(tmp_path / "out"), flag, value])
    assert exit_.value.code == 2
    assert f"finetune.py: error: {expected}" in capsys.readouterr().err
    assert not (tmp_path / "out" / "model").exists()


def test_streaming_without_a_source_is_refused(tmp_path, capsys):
    from hubvit.cli.finetune import main

    with pytest.raises(SystemExit):
        main(["--streaming", "--output_dir", str(tmp_path / "out")])
    assert "--streaming needs --dataset_name" in capsys.readouterr().err


def test_mixup_blends_two_images_and_their_labels_with_one_weight():
    from hubvit.training.data import make_mixer

    assert make_mixer(0.0, 0.0, 3) is None
    torch.manual_seed(0)
    pixels = torch.stack([torch.full((3, 8, 8), float(i)) for i in range(4)])
    mixed, targets = make_mixer(0.8, 0.0, 3)(pixels, torch.tensor([0, 1, 2, 0]))
    torch.testing.assert_close(targets.sum(-1), torch.ones(4))
    weight = targets[1, 1].item()
    assert 0 < weight < 1
    for i in range(4):
        assert mixed[i].unique().numel() == 1, "MixUp blends whole images"
    assert mixed[1].mean().item() == pytest.approx(weight * 1.0 + (1 - weight) * 0.0, abs=1e-6), "image 1 with image 0"


def test_cutmix_pastes_one_rectangle_and_weights_labels_by_its_area():
    from hubvit.training.data import make_mixer

    torch.manual_seed(3)
    pixels = torch.stack([torch.full((3, 16, 16), float(i)) for i in range(2)])
    mixed, targets = make_mixer(0.0, 1.0, 2)(pixels, torch.tensor([0, 1]))
    pasted = mixed[1, 0] != 1.0
    assert 0 < pasted.sum() < 256
    torch.testing.assert_close(targets[1, 1], 1 - pasted.float().mean(), rtol=0, atol=1e-6)


def test_randaugment_changes_training_images_and_leaves_evaluation_alone():
    from PIL import Image

    from hubvit.preprocessing import Preprocessing
    from hubvit.training import make_transforms

    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8))
    plain_train, plain_eval = make_transforms((16, 16), Preprocessing(resample="bilinear"), "none")
    rand_train, rand_eval = make_transforms(
        (16, 16), Preprocessing(resample="bilinear"), "none", randaugment=2, magnitude=9
    )
    torch.manual_seed(0)
    assert any(not torch.equal(rand_train(image), plain_train(image)) for _ in range(5))
    torch.testing.assert_close(rand_eval(image), plain_eval(image), rtol=0, atol=0)


def test_a_recipe_leaves_the_options_a_command_line_names_in_either_spelling():
    from hubvit.training import parse_args
    from hubvit.training.arguments import apply_named_recipe

    args = parse_args(["--output_dir", "unused", "--recipe", "deit", "--weight-decay", "0.01", "--mixup_alpha=0.3"])
    apply_named_recipe(args)
    assert (args.weight_decay, args.mixup_alpha) == (0.01, 0.3)
    assert (args.random_erasing, args.ema_decay, args.cutmix_alpha) == (0.25, 0.99996, 1.0)
    assert args.learning_rate == pytest.approx(5e-4 * 64 / 512), "the embedded digits' batch of 64"


def test_an_abbreviated_flag_is_refused_naming_the_flags_it_resembles(capsys):
    from hubvit.training import parse_args

    with pytest.raises(SystemExit) as error:
        parse_args(["--output_dir", "unused", "--weight_dec", "0.01"])
    err = capsys.readouterr().err
    assert error.value.code == 2 and "unrecognized arguments: --weight_dec 0.01; did you mean --weight_decay" in err


def test_a_recipe_leaves_the_options_a_python_caller_passes_even_at_their_defaults():
    from hubvit.training import Arguments, TrainingArguments
    from hubvit.training.arguments import apply_named_recipe

    keywords = Arguments.build(output_dir="unused", recipe="mae", random_erasing=0.0, per_device_train_batch_size=32)
    apply_named_recipe(keywords)
    assert keywords.random_erasing == 0.0 and keywords.layer_decay == 0.65
    assert keywords.learning_rate == pytest.approx(5e-4 * 32 / 256)
    grouped = Arguments.build(TrainingArguments(recipe="deit", label_smoothing=0.0), output_dir="unused")
    apply_named_recipe(grouped)
    assert grouped.label_smoothing == 0.0 and grouped.drop_path_rate == 0.1


def test_ema_and_loader_position_are_checkpointed_as_safetensors_and_json(tmp_path):
    from hubvit.training.checkpoints import EMA_WEIGHTS, load_extra_state, save_extra_state

    class Loader:
        def __init__(self, state=None):
            self.state = state

        def state_dict(self):
            return self.state

        def load_state_dict(self, state):
            self.state = state

    process = SimpleNamespace(process_index=0, num_processes=1, is_main_process=True)
    trained = ema.model_ema(tiny_model(), 0.9)
    position = {"epoch": 1, "block": 2, "block_start": {"shard_idx": 0}, "position": [3, 4]}
    save_extra_state(process, tmp_path, Loader(position), trained)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data_loader_state_0.json", EMA_WEIGHTS]
    restored, loader = ema.model_ema(tiny_model(), 0.9), Loader()
    with torch.no_grad():
        for p in restored.parameters():
            p.zero_()
    load_extra_state(process, tmp_path, loader, restored)
    assert loader.state == position
    for key, value in trained.state_dict().items():
        assert torch.equal(restored.state_dict()[key], value), key


def test_a_checkpoint_without_the_ema_or_the_positions_of_every_process_is_refused(tmp_path):
    from hubvit.training.arguments import UsageError
    from hubvit.training.checkpoints import load_extra_state, save_extra_state

    loader = SimpleNamespace(state_dict=lambda: {"epoch": 0}, load_state_dict=lambda state: None)
    save_extra_state(SimpleNamespace(process_index=0, num_processes=1, is_main_process=True), tmp_path, loader)
    two = SimpleNamespace(process_index=1, num_processes=2, is_main_process=False)
    with pytest.raises(UsageError, match="positions of 1 streaming process\\(es\\); expected 2"):
        load_extra_state(two, tmp_path, loader)
    one = SimpleNamespace(process_index=0, num_processes=1, is_main_process=True)
    with pytest.raises(UsageError, match="model_ema.safetensors is missing; the checkpoint was written without"):
        load_extra_state(one, tmp_path, None, ema.model_ema(tiny_model(), 0.9))
    (tmp_path / "model_ema.safetensors").write_bytes(b"truncated")
    with pytest.raises(UsageError, match="does not hold this model's EMA"):
        load_extra_state(one, tmp_path, None, ema.model_ema(tiny_model(), 0.9))


# --- augment, randaugment_magnitude, random_erasing and drop_path_rate, as a run applies them -----------------------


def digit_image(seed=0):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (20, 20, 3), dtype=np.uint8))


def test_augment_none_trains_on_the_evaluation_images():
    from hubvit.preprocessing import Preprocessing
    from hubvit.training import make_transforms

    train, evaluation = make_transforms((16, 16), Preprocessing(), "none")
    torch.manual_seed(0)
    torch.testing.assert_close(train(digit_image()), evaluation(digit_image()), rtol=0, atol=0)


@pytest.mark.parametrize("augment", ["affine", "inception"])
def test_augment_moves_training_images_and_keeps_their_size(augment):
    from hubvit.preprocessing import Preprocessing
    from hubvit.training import make_transforms

    train, evaluation = make_transforms((16, 16), Preprocessing(), augment)
    plain = evaluation(digit_image())
    torch.manual_seed(0)
    moved = [train(digit_image()) for _ in range(4)]
    assert all(m.shape == plain.shape for m in moved)
    assert all(not torch.equal(m, plain) for m in moved)


@pytest.mark.parametrize("data, expected", [({}, "affine"), ({"dataset_name": "some/dataset"}, "inception")])
def test_augment_auto_is_affine_for_the_embedded_digits_and_inception_for_a_dataset(data, expected):
    from hubvit.training import Arguments, resolve_defaults

    assert resolve_defaults(Arguments.build(output_dir="unused", **data)).augment == expected


def test_randaugment_defaults_per_column_and_augment_none_turns_it_off(tmp_path, monkeypatch):
    from hubvit.training import Arguments, resolve_defaults
    from hubvit.training.arguments import DEFAULTS

    monkeypatch.setitem(DEFAULTS["embedded"], "randaugment", 2)
    assert resolve_defaults(Arguments.build(output_dir=str(tmp_path))).randaugment == 2
    assert resolve_defaults(Arguments.build(output_dir=str(tmp_path), augment="none")).randaugment == 0
    assert resolve_defaults(Arguments.build(output_dir=str(tmp_path), train_dir="images")).randaugment == 0


def test_randaugment_magnitude_sets_how_far_each_operation_goes():
    """Seeded alike, RandAugment picks the same operations at any magnitude; at magnitude 0 most of them (rotation,
    shear, translation, brightness, colour, contrast, sharpness, posterize) leave the image as it is, so the images
    change less than at 20 (of torchvision's 0-30 scale)."""
    from hubvit.preprocessing import Preprocessing
    from hubvit.training import make_transforms

    preprocessing = Preprocessing(resample="bilinear")
    _, plain = make_transforms((16, 16), preprocessing, "none")
    change = {}
    for magnitude in (0, 20):
        train, _ = make_transforms((16, 16), preprocessing, "none", randaugment=2, magnitude=magnitude)
        outputs = []
        for seed in range(20):
            torch.manual_seed(seed)
            outputs.append(train(digit_image(seed)) - plain(digit_image(seed)))
        change[magnitude] = torch.stack(outputs)
    assert any(not torch.equal(weak, strong) for weak, strong in zip(change[0], change[20]))
    assert change[0].abs().mean() < change[20].abs().mean()


def test_random_erasing_is_applied_to_the_training_images_of_a_run(tmp_path):
    """The loader's images with --random_erasing 1 are those without it, one rectangle aside (the same seed, epoch and
    index draw the same augmentation)."""
    import datasets

    from hubvit.preprocessing import Preprocessing
    from hubvit.training import Arguments, resolve_defaults
    from hubvit.training.data import make_loaders

    split = datasets.Dataset.from_dict({"image": [digit_image(i) for i in range(3)], "label": [0, 1, 0]})
    first = {}
    for probability in (0.0, 1.0):
        args = resolve_defaults(Arguments.build(output_dir=str(tmp_path), augment="none", random_erasing=probability))
        train_set, _, _ = make_loaders(args, split, None, (16, 16), Preprocessing())
        first[probability] = train_set[1][0]
    changed = (first[1.0] != first[0.0]).any(0)
    rows, cols = changed.any(1).nonzero().flatten(), changed.any(0).nonzero().flatten()
    assert 0 < changed.sum() < 16 * 16 and changed.sum() == len(rows) * len(cols)


def test_drop_path_rate_reaches_the_model_a_run_starts_from(tmp_path):
    from hubvit.training import Arguments, load_model, resolve_defaults

    args = resolve_defaults(Arguments.build(output_dir=str(tmp_path), drop_path_rate=0.2))
    model, _ = load_model(args, ["a", "b"])
    rates = [layer.drop_path_rate for layer in model.hubvit.encoder.layers]
    assert model.config.drop_path_rate == 0.2 and rates[0] == 0.0 and rates[-1] == pytest.approx(0.2)
