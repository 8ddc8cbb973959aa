"""Segmentation fine-tuning (scripts/finetune_segmentation.py, `train_segmentation`): the folder it writes serves the
image-segmentation pipeline through remote code alone, a resumed run ends with the weights of an uninterrupted one,
and bad masks are refused in one line. Tiny models, a few steps; the default run's IoU is measured in docs/dense.md.
"""

import json
import re
import shutil

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import pipeline

from hubvit.training.segmentation import train_segmentation
from hubvit.training.segmentation_arguments import SegmentationArguments
from hubvit.training.segmentation_data import (
    DIGIT_LABELS,
    FreshCanvases,
    embedded_canvases,
    load_segmentation_splits,
    place_digits,
)
from hubvit.cli.finetune_segmentation import main
from utils import run_without_hubvit

TINY = dict(
    num_train_canvases=16,
    num_eval_canvases=8,
    per_device_train_batch_size=4,
    per_device_eval_batch_size=8,
    config_overrides="hidden_size=32,num_hidden_layers=2,intermediate_size=64",
    logging_steps=1,
)


def test_embedded_canvases_label_each_digits_strokes_with_its_class_and_hold_out_other_digits():
    rng = np.random.default_rng(0)
    digits = np.zeros((2, 28, 28), np.uint8)
    digits[0, 10:18, 12:15] = 200  # a stroke of digit "3"
    digits[0, 5, 5] = 100  # faint: background
    digits[1, 3:25, 14] = 255  # a stroke of digit "7"
    image, mask = place_digits(digits, np.array([3, 7]), rng, count=(3, 3))
    assert set(np.unique(mask)) <= {0, 4, 8}
    assert np.array_equal(mask > 0, image >= 128), "stroke pixels, and only those, carry a digit's class"
    train, held_out = embedded_canvases(8, 4)
    again, _ = embedded_canvases(8, 4)
    assert train["mask"][0].tobytes() == again["mask"][0].tobytes(), "the split does not depend on the run"
    assert {np.asarray(m).max() for m in held_out["mask"]} <= set(range(1, 11))


def test_fresh_canvases_differ_across_epochs_and_repeat_for_the_same_seed_and_epoch(monkeypatch):
    """The default training canvases are placed anew each epoch from (seed, epoch, index): the same triple gives the
    same canvas in any process (what exact resumption needs), another epoch or seed other canvases."""
    from hubvit.preprocessing import Preprocessing
    from hubvit.training import segmentation_data

    digit_split = segmentation_data.embedded_digit_split()
    monkeypatch.setattr(segmentation_data, "embedded_digit_split", lambda: digit_split)  # parsed once
    train, _ = embedded_canvases(8, 4)
    digits, labels = train.digits

    def canvases_of(seed, epoch):
        fresh = FreshCanvases(train.digits, 6, seed, (64, 64), Preprocessing())
        fresh.set_epoch(epoch)
        return [fresh.canvas(i) for i in range(6)], [fresh[i] for i in range(6)]

    (first, tensors), (again, tensors_again) = canvases_of(0, 1), canvases_of(0, 1)
    for (image, mask), (image2, mask2) in zip(first, again):
        assert np.array_equal(image, image2) and np.array_equal(mask, mask2)
    for (pixels, mask), (pixels2, mask2) in zip(tensors, tensors_again):
        assert torch.equal(pixels, pixels2) and torch.equal(mask, mask2)
    other_epoch, _ = canvases_of(0, 2)
    other_seed, _ = canvases_of(1, 1)
    for other in (other_epoch, other_seed):
        assert not any(np.array_equal(a[0], b[0]) for a, b in zip(first, other))
    for (image, mask), (pixels, mask_tensor) in zip(first, tensors):
        assert np.array_equal(mask > 0, image >= 128) and torch.equal(mask_tensor, torch.from_numpy(mask).long())
        assert torch.allclose(pixels, torch.from_numpy(image).float().div(255).sub(0.5).div(0.5).expand(3, 64, 64))
    assert len(digits) == len(labels) == 4250, "the training 85% of the 5,000 digits, never the held-out ones"
    for fresh in (True, False):
        args = SegmentationArguments(output_dir="unused", num_train_canvases=8, num_eval_canvases=4)
        args.fresh_canvases = fresh
        split, *_ = load_segmentation_splits(args)
        assert (split.digits is not None) == fresh, "--fresh_canvases False trains on the fixed canvases"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("segmentation") / "out"
    result = train_segmentation(output_dir=str(out), max_train_steps=3, **TINY)
    return result


def test_run_writes_a_folder_the_pipeline_serves_without_hubvit(trained, tmp_path):
    folder = trained.model_dir
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSemanticSegmentation"] == "modeling_hubvit.HubViTForSemanticSegmentation"
    assert list(config["id2label"].values()) == DIGIT_LABELS
    assert json.loads((folder / "preprocessor_config.json").read_text())["image_processor_type"] == (
        "SegformerImageProcessor"
    )
    assert 0 <= trained.metrics["eval_mean_iou"] <= 1 and trained.metrics["global_step"] == 3
    image = tmp_path / "canvas.png"
    trained.eval_dataset[0]["image"].resize((80, 72)).save(image)
    expected = [
        (row["label"], np.asarray(row["mask"]).tolist())
        for row in pipeline("image-segmentation", model=str(folder))(str(image))
    ]
    assert expected and all(len(mask) == 72 and len(mask[0]) == 80 for _, mask in expected)
    isolated = run_without_hubvit(
        f"""
        import json
        import numpy as np
        from transformers import pipeline
        segmenter = pipeline("image-segmentation", model={str(folder)!r}, trust_remote_code=True)
        rows = segmenter({str(image)!r})
        print(json.dumps(dict(
            module=type(segmenter.model).__module__,
            rows=[[row["label"], np.asarray(row["mask"]).tolist()] for row in rows],
        )))
        """,
        cwd=tmp_path,
    )
    assert isolated["module"].startswith("transformers_modules.")
    assert [tuple(row) for row in isolated["rows"]] == expected


def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    """4 batches per epoch, checkpoint at update 3 (mid-epoch): resuming replays updates 4-6 across the epoch end,
    the second epoch's fresh canvases included."""
    options = dict(TINY, max_train_steps=6, checkpointing_steps="3")
    out = tmp_path / "out"
    train_segmentation(output_dir=str(out), **options)
    uninterrupted = load_file(out / "model" / "model.safetensors")
    middle = load_file(out / "checkpoints" / "checkpoint_3" / "model.safetensors")
    assert any(not torch.equal(middle[k], uninterrupted[k]) for k in middle), "updates 4-6 changed the weights"
    resumed_out = tmp_path / "resumed"
    resumed_out.mkdir()
    (resumed_out / "checkpoints").mkdir()
    shutil.copytree(out / "checkpoints" / "checkpoint_3", resumed_out / "checkpoints" / "checkpoint_3")
    result = train_segmentation(output_dir=str(resumed_out), resume_from_checkpoint="latest", **options)
    assert result.metrics["global_step"] == 6
    resumed = load_file(resumed_out / "model" / "model.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    for key in uninterrupted:
        assert torch.equal(resumed[key], uninterrupted[key]), key


def saved_dataset(root, mask_column="mask", size=(16, 16), value=1):
    """Six 16x16 images with masks of class 1 squares; row 4's mask has `size` (width, height) and `value`."""
    images = [Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)) for i in range(6)]
    masks = []
    for i in range(6):
        mask = np.zeros((size[1], size[0]) if i == 4 else (16, 16), np.uint8)
        mask[4:8, 4:8] = value if i == 4 else 1
        masks.append(Image.fromarray(mask, mode="L"))
    features = datasets.Features({"image": datasets.Image(), mask_column: datasets.Image()})
    datasets.Dataset.from_dict({"image": images, mask_column: masks}, features=features).save_to_disk(str(root))
    return root


@pytest.mark.parametrize(
    "case, expected",
    [
        ("size", r"train row 4: its mask is 12x10 \(width x height\) but its image is 16x16"),
        ("label", r"train row 4: its mask holds label 7, outside the 3 classes 0\.\.2"),
        ("column", r"--mask_column_name 'mask' is not a column of the train split; columns: \['annotation', 'image'\]"),
    ],
)
def test_bad_masks_are_one_line_naming_the_value(case, expected, tmp_path, capsys):
    data, extra = tmp_path / "data", []
    if case == "size":
        saved_dataset(data, size=(12, 10))
    elif case == "label":
        saved_dataset(data, value=7)
        extra = ["--label_names", "background,a,b"]
    else:
        saved_dataset(data, mask_column="annotation")
    argv = ["--dataset_name", str(data), "--output_dir", str(tmp_path / "out"), "--max_train_steps", "1", *extra]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("finetune_segmentation.py: error:")]
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    assert re.search(expected, lines[0]), lines[0]
    assert not (tmp_path / "out" / "model").exists()


def test_a_classifiers_folder_gives_the_body_and_a_new_pixel_head(tmp_path):
    """--model_name_or_path: every body tensor as saved, the image classifier left out, the head new; a folder whose
    body does not fit its config is refused by name."""
    from hubvit import HubViTForImageClassification
    from hubvit.folder import write_folder
    from hubvit.training.segmentation import build_model
    from utils import randomize_, tiny_config

    classifier = randomize_(HubViTForImageClassification(tiny_config(num_labels=10)), seed=3).eval()
    folder = write_folder(classifier, tmp_path / "classifier")
    args = SegmentationArguments(output_dir=str(tmp_path / "out"), model_name_or_path=str(folder))
    args.decode_head_pixels = True
    model, _ = build_model(args, DIGIT_LABELS)
    assert model.config.decode_head_pixels and model.decode_head.out_features == 11 * 8 * 8
    for name, tensor in classifier.hubvit.state_dict().items():
        assert torch.equal(model.hubvit.state_dict()[name], tensor), name
    weights = load_file(folder / "model.safetensors")
    weights.pop("hubvit.embeddings.patch_embedding.bias")
    from safetensors.torch import save_file

    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"encoder.s weights do not fit .*patch_embedding\.bias"):
        build_model(args, DIGIT_LABELS)


def test_the_pixel_head_puts_each_tokens_outputs_on_the_pixels_of_its_patch():
    """`decode_head_pixels`: the logit of class k at pixel (r * ph + i, c * pw + j) is output k * ph * pw + i * pw + j
    of the head on token (r, c); non-square grid, registers dropped; another patch size is refused."""
    from hubvit import HubViTForSemanticSegmentation
    from utils import randomize_, tiny_config

    model = HubViTForSemanticSegmentation(
        tiny_config(num_labels=3, decode_head_pixels=True, num_register_tokens=1, patch_size=4)
    )
    model = randomize_(model, seed=5).eval()
    x = torch.randn(2, 3, 12, 20, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(x).logits
        tokens = model.hubvit(x).last_hidden_state[:, model.config.num_prefix_tokens :]
        outputs = model.decode_head(tokens).reshape(2, 3, 5, 3, 4, 4)  # (batch, rows, columns, class, i, j)
    assert logits.shape == (2, 3, 12, 20)
    for r, c, k, i, j in [(0, 0, 0, 0, 0), (2, 4, 2, 3, 1), (1, 3, 1, 2, 3)]:
        assert logits[1, k, r * 4 + i, c * 4 + j] == outputs[1, r, c, k, i, j]
    with pytest.raises(ValueError, match=r"patch_size=2: a decode_head_pixels head .* runs only at that patch size"):
        model(x, patch_size=2)


def test_the_predictions_picture_shows_images_truth_and_the_pipelines_masks(trained, tmp_path):
    """The script's OUT/predictions.png (the one docs/dense.md shows): three rows of `count` panels."""
    from PIL import Image

    from hubvit.cli.finetune_segmentation import draw_predictions

    path = tmp_path / "predictions.png"
    draw_predictions(trained.model_dir, trained.eval_dataset, "image", "mask", path, count=4)
    width, height = Image.open(path).size
    assert (width, height) == (640, 500), "1.6 x 5.0 inches at 100 dpi for 4 columns"
