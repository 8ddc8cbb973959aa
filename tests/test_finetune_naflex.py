"""Fine-tuning with `--max_num_patches N` (NaFlex): each image at its own aspect ratio, as padded patch sequences.

The peer here is transformers' own `Siglip2ImageProcessor`, which the trained folder carries: the patches the run's
evaluation pipeline cuts must be the ones it cuts (float32 rounding of the same resize and normalisation, 1e-6).
"""

import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import hubvit
from hubvit.errors import UsageError

TINY = dict(
    max_num_patches=16,
    config_overrides="hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64",
    max_train_samples=64,
    max_eval_samples=40,
    per_device_train_batch_size=16,
    logging_steps=1,
    dataloader_num_workers=0,
)


@pytest.fixture(scope="module")
def naflex_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("naflex") / "out"
    return hubvit.train(output_dir=str(out), max_train_steps=4, **TINY)


def canvases():
    """Three photographs-like test images of other aspect ratios than the training canvases."""
    rng = np.random.default_rng(0)
    return [Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8")) for h, w in ((30, 70), (50, 20), (33, 33))]


def test_the_folder_carries_siglip2s_processor_and_the_eval_pipeline_cuts_its_patches(naflex_run):
    from torchvision.transforms import v2
    from transformers import AutoImageProcessor, Siglip2ImageProcessor

    from hubvit.training.data import TORCHVISION_INTERPOLATION
    from hubvit.training.naflex import Patchified, naflex_transforms

    processor = AutoImageProcessor.from_pretrained(naflex_run.model_dir)
    assert isinstance(processor, Siglip2ImageProcessor) and processor.max_num_patches == 16
    tail = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(processor.image_mean), list(processor.image_std))]
    _, evaluation = naflex_transforms(7, 16, TORCHVISION_INTERPOLATION["bilinear"], "none", 0, 9, tail)
    for image in canvases():
        ours, grid = Patchified(evaluation, 7)(image)
        theirs = processor(image, return_tensors="pt")
        assert theirs["spatial_shapes"][0].tolist() == list(grid)
        assert int(theirs["pixel_attention_mask"].sum()) == ours.shape[0] == grid[0] * grid[1] <= 16
        assert (theirs["pixel_values"][0, : ours.shape[0]] - ours).abs().max() <= 1e-6


def test_the_trained_folder_classifies_through_the_pipeline(naflex_run):
    from transformers import pipeline

    classify = pipeline("image-classification", model=str(naflex_run.model_dir), trust_remote_code=True)
    answers = [classify(image, top_k=10) for image in canvases()]
    assert all(len(answer) == 10 and abs(sum(a["score"] for a in answer) - 1) < 1e-5 for answer in answers)


def test_the_card_says_each_image_kept_its_aspect_ratio(naflex_run):
    card = (naflex_run.model_dir / "README.md").read_text()
    assert "at most 16 whole patches (SigLIP 2's NaFlex rule)" in card


def test_a_batch_pads_to_its_longest_sequence_and_marks_each_images_own_patches():
    from hubvit.training.naflex import collate_sequences

    batch = [(torch.ones(6, 147), (2, 3)), (2 * torch.ones(15, 147), (3, 5)), (3 * torch.ones(4, 147), (2, 2))]
    sequences, labels = collate_sequences([(item, label) for item, label in zip(batch, (4, 1, 7))])
    assert sequences.shape == (3, 15, 147) and labels.tolist() == [4, 1, 7]
    assert sequences.mask.sum(-1).tolist() == [6, 15, 4] and sequences.shapes.tolist() == [[2, 3], [3, 5], [2, 2]]
    assert sequences.patches[0, 6:].abs().max() == 0 and sequences.patches[2, :4].eq(3).all()
    assert abs(sequences.padding_share() - (1 - 25 / 45)) < 1e-6


def test_the_embedded_default_puts_every_digit_on_one_of_five_canvases():
    from hubvit.training.data import embedded_digits
    from hubvit.training.naflex import ASPECTS, digits_on_canvases

    digits = embedded_digits().select(range(200))
    placed = digits_on_canvases(digits)
    sizes = {image.size[::-1] for image in placed["image"]}
    assert sizes == set(ASPECTS) and placed["label"] == digits["label"]
    for digit, canvas in zip(digits.select(range(20))["image"], placed.select(range(20))["image"]):
        assert np.asarray(canvas).sum() == np.asarray(digit.convert("L")).sum()  # the whole digit, nothing else


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    """4 batches per epoch, a checkpoint at update 3: resuming replays updates 4-6 across the epoch's end."""
    options = dict(TINY, max_train_steps=6, checkpointing_steps="3")
    out = tmp_path / "out"
    hubvit.train(output_dir=str(out), **options)
    uninterrupted = load_file(out / "model" / "model.safetensors")
    resumed_out = tmp_path / "resumed"
    shutil.copytree(out / "checkpoints" / "checkpoint_3", resumed_out / "checkpoints" / "checkpoint_3")
    result = hubvit.train(output_dir=str(resumed_out), resume_from_checkpoint="latest", **options)
    assert result.metrics["global_step"] == 6
    resumed = load_file(resumed_out / "model" / "model.safetensors")
    for key in uninterrupted:
        assert torch.equal(resumed[key], uninterrupted[key]), key


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(mixup_alpha=0.2), "does not combine with --mixup_alpha 0.2"),
        (dict(patch_sizes="7,14"), "does not combine with --patch_sizes 7,14"),
        (dict(max_num_patches=0), "--max_num_patches must be >= 1, got 0"),
    ],
)
def test_options_that_need_a_batch_of_squares_are_refused_by_name(tmp_path, options, message):
    with pytest.raises(UsageError, match=message):
        hubvit.train(output_dir=str(tmp_path / "out"), **{**TINY, **options})
    assert not (tmp_path / "out" / "model").exists()


def test_a_model_whose_blocks_read_one_grid_is_refused_before_training(tmp_path):
    overrides = TINY["config_overrides"] + ",position_embedding_type=relative_2d"
    with pytest.raises(UsageError, match="position_embedding_type='relative_2d'"):
        hubvit.train(output_dir=str(tmp_path / "out"), **{**TINY, "config_overrides": overrides})


def test_a_streamed_naflex_run_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path):
    """--streaming with --max_num_patches: shards of canvases at five aspect ratios stream as padded patch
    sequences; a checkpoint at update 2 of 4 (two epochs of two batches) resumes onto the uninterrupted weights."""
    from hubvit.training import shards
    from hubvit.training.data import embedded_digits
    from hubvit.training.naflex import digits_on_canvases

    data = tmp_path / "shards"
    canvases = digits_on_canvases(embedded_digits().shuffle(seed=0).select(range(44)))
    shards.write_shards(canvases.select(range(32)), data, num_shards=2)
    shards.write_shards(canvases.select(range(32, 44)), data, num_shards=1, split="validation", shuffle_seed=None)
    options = {k: v for k, v in TINY.items() if not k.startswith("max_") or k == "max_num_patches"}
    options.update(
        streaming=True,
        dataset_name=str(data),
        shuffle_buffer=8,
        max_train_steps=4,
        checkpointing_steps="2",
    )
    whole = hubvit.train(output_dir=str(tmp_path / "whole"), **options)
    assert whole.metrics["global_step"] == 4 and 0.0 <= whole.metrics["eval_accuracy"] <= 1.0
    shutil.copytree(
        tmp_path / "whole" / "checkpoints" / "checkpoint_2", tmp_path / "resumed" / "checkpoints" / "checkpoint_2"
    )
    hubvit.train(output_dir=str(tmp_path / "resumed"), resume_from_checkpoint="latest", **options)
    uninterrupted = load_file(tmp_path / "whole" / "model" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model" / "model.safetensors")
    for key in uninterrupted:
        assert torch.equal(resumed[key], uninterrupted[key]), key


class Epoch:
    """The images' epoch, which the loop sets and the batch order reads."""

    epoch = 0


def padding_of(batches, counts):
    """The share of a batch's positions that are padding, when each pads to its longest."""
    positions = sum(len(batch) * max(counts[i] for i in batch) for batch in batches)
    return 1 - sum(counts[i] for batch in batches for i in batch) / positions


def test_batches_of_one_patch_count_hold_every_image_once_with_less_padding_than_random():
    from hubvit.training.naflex import PatchCountBatches

    counts = np.random.default_rng(0).choice([12, 15, 16], size=203, p=[0.2, 0.5, 0.3]).tolist()
    sampler = PatchCountBatches(counts, 16, Epoch())
    batches = list(sampler)
    assert sorted(i for batch in batches for i in batch) == list(range(203))
    assert len(batches) == len(sampler) == 13  # ceil(203 / 16): as many batches as drawn at random
    mixed = [batch for batch in batches if len({counts[i] for i in batch}) > 1]
    assert len(mixed) <= 2  # only the pooled remainders of the three counts mix
    order = np.random.default_rng(1).permutation(203).tolist()
    drawn = [order[i : i + 16] for i in range(0, 203, 16)]
    assert padding_of(batches, counts) < 0.01 < padding_of(drawn, counts)


def test_the_batch_order_is_a_function_of_the_seed_and_the_images_epoch():
    from hubvit.training.naflex import PatchCountBatches

    counts = [15, 16] * 40
    images = Epoch()
    first = list(PatchCountBatches(counts, 8, images, seed=3))
    assert list(PatchCountBatches(counts, 8, images, seed=3)) == first
    assert list(PatchCountBatches(counts, 8, images, seed=4)) != first
    images.epoch = 1
    assert list(PatchCountBatches(counts, 8, images, seed=3)) != first


def test_patch_counts_read_from_the_files_sizes_are_the_patches_the_pipeline_cuts():
    from torchvision.transforms import v2

    from hubvit.training.data import embedded_digits
    from hubvit.training.naflex import Patchified, digits_on_canvases, naflex_transforms, natural_patch_counts

    canvases = digits_on_canvases(embedded_digits().select(range(30)))
    tail = [v2.ToDtype(torch.float32, scale=True)]
    _, evaluation = naflex_transforms(7, 16, v2.InterpolationMode.BILINEAR, "none", 0, 9, tail)
    cut = Patchified(evaluation, 7)
    counts = natural_patch_counts(canvases, "image", 7, 16)
    assert counts == [cut(image)[0].shape[0] for image in canvases["image"]] and set(counts) == {15, 16}


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(max_num_patches=None, naflex_batching="random"), "--naflex_batching random orders NaFlex batches"),
        (
            dict(naflex_batching="patch_count", streaming=True, dataset_name="unused"),
            "--streaming reads its stream in the buffer's order",
        ),
    ],
)
def test_a_batch_order_without_its_batches_is_refused_by_name(tmp_path, options, message):
    whole_sets = {k: v for k, v in TINY.items() if k not in ("max_train_samples", "max_eval_samples")}
    with pytest.raises(UsageError, match=message):
        hubvit.train(output_dir=str(tmp_path / "out"), **{**whole_sets, **options})


def test_an_image_folder_of_mixed_sizes_trains_in_batches_of_one_patch_count(tmp_path):
    """PNG files of four sizes in class folders: the counts come from the files' headers (paths, not bytes), and
    under an augmentation that keeps sizes (affine) every training batch holds one patch count (batch 4, budget 16
    of 7 px: 16 files of 15 patches, 8 of 16, 8 of 14)."""
    from hubvit.training import loop

    rng = np.random.default_rng(0)
    for split in ("train", "validation"):
        for label in ("round", "square"):
            folder = tmp_path / split / label
            folder.mkdir(parents=True)
            for k, (h, w) in enumerate([(28, 56), (56, 28), (30, 30), (21, 70)] * (1 if split == "validation" else 4)):
                Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8")).save(folder / f"{k}.png")
    seen = []
    real = loop.train_epoch

    def train_epoch(run, *args, **kwargs):
        seen.extend(batch.mask.sum(1).unique().tolist() for batch, _ in run.train_loader)
        return real(run, *args, **kwargs)

    options = {k: v for k, v in TINY.items() if not k.startswith("max_") or k == "max_num_patches"}
    options.update(per_device_train_batch_size=4, max_train_steps=8, augment="affine")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "train_epoch", train_epoch)
        result = hubvit.train(
            output_dir=str(tmp_path / "out"),
            train_dir=str(tmp_path / "train"),
            validation_dir=str(tmp_path / "validation"),
            **options,
        )
    assert result.metrics["global_step"] == 8 and result.metrics["eval_samples"] == 8
    assert len(seen) == 8 and all(len(counts) == 1 for counts in seen), seen


def test_a_patch_budget_no_attention_could_serve_is_refused_before_training(tmp_path):
    """100,000 patches per image: more tokens than any attention here takes (it stalled at step 0 of 2)."""
    with pytest.raises(UsageError, match="--max_num_patches 100000: 100000 patches per image gives 100001 tokens"):
        hubvit.train(output_dir=str(tmp_path / "out"), **{**TINY, "max_num_patches": 100000})
    assert not (tmp_path / "out" / "model").exists()


def test_resuming_with_another_patch_budget_is_refused_naming_both(tmp_path):
    options = dict(TINY, max_train_steps=2, checkpointing_steps="1")
    hubvit.train(output_dir=str(tmp_path / "out"), **options)
    budget = options["max_num_patches"]
    for other, said in ((budget * 2, f"--max_num_patches {budget * 2}"), (None, "--max_num_patches none")):
        with pytest.raises(UsageError, match=f"was trained with --max_num_patches {budget}; this run has {said}"):
            hubvit.train(
                output_dir=str(tmp_path / "out"),
                resume_from_checkpoint="latest",
                **{**options, "max_num_patches": other},
            )
