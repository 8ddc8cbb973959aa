"""Semantic segmentation fine-tuning with Accelerate over `datasets` (`scripts/finetune_segmentation.py`,
`hubvit.training.segmentation.train_segmentation`).

The same conventions as the classification run (`train`): typed options parsed by `hubvit.options`, one
Accelerator (DDP and mixed precision through it), Accelerate's checkpoints with exact resumption (a seeded sampler,
no other randomness in the data), `evaluate` metrics loaded from the scripts shipped in `hubvit/training/metrics`
(`mean_iou`), and the one hubvit folder writer for OUTPUT_DIR/model: a `HubViTForSemanticSegmentation` with a
`SegformerImageProcessor`, whose `post_process_semantic_segmentation` serves `pipeline("image-segmentation")`.

The loss is the pixel-wise cross-entropy at the labels' resolution, optionally class-weighted (`--class_weighting`):
the embedded digits are 96 % background, and unweighted the model learns to predict background everywhere.
"""

import dataclasses
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .checks import TrainingInputError
from .loop import Task
from .run import TrainingResult
from .segmentation_arguments import IGNORE_INDEX, SCRATCH, SegmentationArguments, check_options

logger = logging.getLogger("hubvit.finetune")

# ------------------------------------------------------------------------------------------------- labels and model


def label_names_for(args, train_split):
    from .segmentation_data import DIGIT_LABELS, infer_num_labels

    if args.label_names:
        names = [name.strip() for name in args.label_names.split(",")]
        if len(names) < 2 or any(not name for name in names) or len(set(names)) != len(names):
            raise TrainingInputError(
                f"--label_names {args.label_names!r}: expected at least 2 distinct, non-empty comma-separated names"
            )
        return names
    if not (args.dataset_name or args.train_dir):
        return list(DIGIT_LABELS)
    return [str(i) for i in range(max(2, infer_num_labels(train_split, args, IGNORE_INDEX)))]


def build_model(args, names):
    """(HubViTForSemanticSegmentation, Preprocessing): a hubvit folder's body with a new head, or from scratch."""
    from .. import HubViTConfig, HubViTForSemanticSegmentation
    from ..preprocessing import Preprocessing

    from .model import checkpoint_preprocessing, check_image_size

    id2label = dict(enumerate(names))
    label2id = {name: i for i, name in id2label.items()}
    labels = dict(num_labels=len(names), id2label=id2label, label2id=label2id)
    pixels = {} if args.decode_head_pixels is None else {"decode_head_pixels": args.decode_head_pixels}
    if not args.model_name_or_path:
        try:
            config = HubViTConfig(**{**SCRATCH, **pixels}, **labels, semantic_loss_ignore_index=IGNORE_INDEX)
            if args.config_overrides:
                config.update_from_string(args.config_overrides)
                config.validate_architecture()
        except (ValueError, TypeError) as error:
            raise TrainingInputError(f"bad --config_overrides {args.config_overrides!r}: {error}") from None
        check_image_size(args.image_size, config)
        if args.image_size:
            config.image_size = args.image_size
        return HubViTForSemanticSegmentation(config), Preprocessing()
    from transformers import AutoConfig

    path = args.model_name_or_path
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError) as error:
        raise TrainingInputError(f"cannot load a config from --model_name_or_path {path!r}: {error}") from None
    if config.model_type != "hubvit":
        raise TrainingInputError(
            f"--model_name_or_path {path!r} is a {config.model_type!r} checkpoint; convert it first (`hubvit convert`)"
        )
    check_image_size(args.image_size, config)
    config.id2label, config.label2id = id2label, label2id
    config.semantic_loss_ignore_index = IGNORE_INDEX
    for key, value in pixels.items():
        setattr(config, key, value)
    try:
        model, info = HubViTForSemanticSegmentation.from_pretrained(
            path, config=config, ignore_mismatched_sizes=True, output_loading_info=True
        )
    except (OSError, ValueError, RuntimeError) as error:
        raise TrainingInputError(f"cannot load --model_name_or_path {path!r}: {str(error).splitlines()[0]}") from None
    body_problems = sorted(
        key
        for kind in ("missing_keys", "mismatched_keys")
        for key in (k if isinstance(k, str) else k[0] for k in info.get(kind, ()))
        if not key.startswith("decode_head.")
    )
    if body_problems:
        raise TrainingInputError(
            f"--model_name_or_path {path!r}: the encoder's weights do not fit its config, training would start from "
            f"random layers: {', '.join(body_problems)}"
        )
    if args.image_size:
        model.resize_position_embeddings(args.image_size)
    return model, checkpoint_preprocessing(path)


def class_weights(counts, weighting):
    """Loss weights from the training masks' pixel counts, scaled so that the mean weight per pixel is 1."""
    counts = np.asarray(counts, np.float64)
    if weighting == "none":
        return None
    frequency = counts / max(counts.sum(), 1)
    present = frequency > 0
    weights = np.zeros_like(frequency)
    weights[present] = frequency[present] ** (-0.5 if weighting == "inverse_sqrt" else -1.0)
    weights /= max((weights * frequency).sum(), 1e-12)
    return torch.tensor(weights, dtype=torch.float32)


def pixel_loss(logits, masks, weights):
    """Cross-entropy per pixel at the masks' resolution (logits upsampled bilinearly), ignored pixels left out."""
    if logits.shape[-2:] != masks.shape[-2:]:
        logits = F.interpolate(logits, size=masks.shape[-2:], mode="bilinear", align_corners=False)
    weight = None if weights is None else weights.to(logits.device)
    return F.cross_entropy(logits.float(), masks, weight=weight, ignore_index=IGNORE_INDEX)


# ------------------------------------------------------------------------------------------------------ the task


class Segmentation(Task):
    """Semantic segmentation in the one loop: pixel-wise cross entropy (class weights where asked) against the
    masks, mean IoU after each epoch."""

    tracker = "hubvit-segmentation"

    def __init__(self, weights, num_labels, eval_samples):
        self.weights, self.num_labels, self.eval_samples = weights, num_labels, eval_samples

    def loss(self, run, pixels, masks, global_step):
        return pixel_loss(run.model(pixel_values=pixels).logits, masks, self.weights)

    def evaluate(self, run):
        return evaluate_segmentation(run)

    def finish(self, run):
        return {"eval_samples": self.eval_samples, "seed": run.args.seed}


@torch.no_grad()
def evaluate_segmentation(run):
    """`mean_iou` (the `evaluate` metric shipped in hubvit/training/metrics) and the mean loss on the held-out split."""
    from .evaluation import load_metric

    metric = load_metric("mean_iou")
    model, accelerator = run.model, run.accelerator
    model.eval()
    total, batches = 0.0, 0
    for pixels, masks in run.eval_loader:
        logits = model(pixel_values=pixels).logits.float()
        logits = F.interpolate(logits, size=masks.shape[-2:], mode="bilinear", align_corners=False)
        total += pixel_loss(logits, masks, None).item()
        batches += 1
        predictions, references = accelerator.gather_for_metrics((logits.argmax(1), masks))
        metric.add_batch(predictions=predictions.cpu().numpy(), references=references.cpu().numpy())
    model.train()
    scores = metric.compute(num_labels=run.task.num_labels, ignore_index=IGNORE_INDEX)
    names = accelerator.unwrap_model(model).config.id2label
    return {
        "eval_mean_iou": float(scores["mean_iou"]),
        "eval_mean_accuracy": float(scores["mean_accuracy"]),
        "eval_overall_accuracy": float(scores["overall_accuracy"]),
        "eval_loss": total / max(batches, 1),
        "eval_per_category_iou": {
            names[i]: (None if math.isnan(v) else round(float(v), 4)) for i, v in enumerate(scores["per_category_iou"])
        },
    }


def prepare(args, accelerator, train_split, eval_split, model, preprocessing, weights):
    """The loop's `Run` over image-mask pairs (fresh canvases each epoch for the embedded digits)."""
    from .loop import assemble
    from .segmentation_data import FreshCanvases, SegmentationPairs, collate

    size = tuple(model.config.image_size_2d)
    pairs = [
        SegmentationPairs(split, args.image_column_name, args.mask_column_name, size, preprocessing)
        for split in (train_split, eval_split)
    ]
    if getattr(train_split, "digits", None) is not None:
        pairs[0] = FreshCanvases(train_split.digits, len(train_split), args.seed, size, preprocessing)
    train_loader = torch.utils.data.DataLoader(
        pairs[0],
        batch_size=args.per_device_train_batch_size,
        shuffle=True,
        collate_fn=collate,
        num_workers=args.dataloader_num_workers,
        generator=torch.Generator().manual_seed(args.seed),
    )
    eval_loader = torch.utils.data.DataLoader(
        pairs[1],
        batch_size=args.per_device_eval_batch_size,
        collate_fn=collate,
        num_workers=args.dataloader_num_workers,
    )
    train_loader, eval_loader = accelerator.prepare(train_loader, eval_loader)
    num_labels = model.config.num_labels
    run = assemble(args, accelerator, model, pairs[0], train_loader, eval_loader, len(train_split))
    run.task = Segmentation(weights, num_labels, len(eval_split))
    return run


def fit_segmentation(args, accelerator, train_split, eval_split, model, preprocessing, weights):
    """Train with the recipe in `args` through the one loop, evaluating after every epoch; returns (run, metrics)."""
    from .loop import train

    run = prepare(args, accelerator, train_split, eval_split, model, preprocessing, weights)
    return train(run)


# ------------------------------------------------------------------------------------------------------ the run


def train_segmentation(*groups, command=None, **options):
    """Fine-tune (or train from scratch) a hubvit semantic segmentation model; returns a `TrainingResult`.

    `groups`: any of the four argument groups (or one `SegmentationArguments`); `options`: the same fields by
    keyword, e.g. `train_segmentation(output_dir="out", max_train_steps=20)`. Bad input (options, masks, the
    starting folder) raises `TrainingInputError` (a `hubvit.HubViTError`) with one line, before training starts.
    """
    from accelerate.utils import set_seed

    from .checkpoints import check_earlier_checkpoints
    from .checks import check_model_folder
    from .loop import start_run
    from .segmentation_data import load_segmentation_splits, scan_masks

    started = time.time()
    args = SegmentationArguments.build(*groups, **options)
    args.torch_compile = None
    check_options(args)
    check_model_folder(args.output_dir, args.model_name_or_path)
    check_earlier_checkpoints(args.output_dir, args.overwrite_output_dir, args.resume_from_checkpoint)
    accelerator = start_run(args)
    with accelerator.main_process_first():
        train_split, eval_split, source, eval_name = load_segmentation_splits(args)
    names = label_names_for(args, train_split)
    counts = scan_masks(train_split, args, "train", len(names), IGNORE_INDEX)
    scan_masks(eval_split, args, eval_name, len(names), IGNORE_INDEX)
    weights = class_weights(counts, args.class_weighting)
    model, preprocessing = build_model(args, names)
    set_seed(args.seed)  # a new head from a folder drew from the RNG: the same state whatever the start
    run, results = fit_segmentation(args, accelerator, train_split, eval_split, model, preprocessing, weights)
    results["total_runtime_s"] = round(time.time() - started, 2)
    export(run, results, (source, eval_name), preprocessing, command or python_call(args))
    accelerator.end_training()
    out = Path(args.output_dir)
    return TrainingResult(out, out / "model", results, eval_split)


def python_call(args):
    defaults = SegmentationArguments(output_dir=args.output_dir)
    changed = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(args)
        if getattr(args, f.name) != getattr(defaults, f.name) or f.name == "output_dir"
    }
    return "train_segmentation(" + ", ".join(f"{k}={v!r}" for k, v in changed.items()) + ")"


def segmentation_processor(config, preprocessing):
    """transformers' `SegformerImageProcessor` at the model's resolution: resize, rescale, normalise, and
    `post_process_semantic_segmentation` (logits upsampled to the image, argmax) for the pipeline."""
    from PIL import Image
    from transformers import SegformerImageProcessor

    from ..preprocessing import resample_name

    filters = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}
    height, width = config.image_size_2d
    return SegformerImageProcessor(
        size={"height": height, "width": width},
        resample=filters.get(resample_name(preprocessing.resample), Image.BICUBIC),
        image_mean=list(preprocessing.mean),
        image_std=list(preprocessing.std),
        do_reduce_labels=False,
    )


def export(run, results, data, preprocessing, command):
    """OUTPUT_DIR/model through hubvit's folder writer, and all_results.json."""
    from .. import HubViTForSemanticSegmentation
    from ..card import CardInfo
    from ..folder import write_folder

    accelerator, args = run.accelerator, run.args
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(run.model)
    if not accelerator.is_main_process:
        return
    config = accelerator.unwrap_model(run.model).config
    final = HubViTForSemanticSegmentation(config)
    final.load_state_dict({k: v.detach().cpu() for k, v in state_dict.items()})
    source, eval_name = data
    base = args.model_name_or_path
    card = CardInfo(
        provenance=(f"Fine-tuned from `{base}`" if base else "Trained from scratch")
        + f" for semantic segmentation on {source}: {results['train_samples']} training images, "
        f"{results['eval_samples']} held out, {results['epochs']} epochs with hubvit's segmentation script "
        f"({args.optimizer}, lr {args.learning_rate:g}, {args.class_weighting} class weighting). Held-out mean IoU "
        f"{results['eval_mean_iou']:.4f}.",
        command=command,
        family="fine-tuned" if base else "trained-from-scratch",
        eval_split=eval_name,
        datasets=[args.dataset_name] if args.dataset_name and not Path(args.dataset_name).exists() else [],
        base_model=base if base and not Path(base).exists() else None,
        repo_id=args.push_to_hub or "REPO_ID",
    )
    out = Path(args.output_dir)
    write_folder(final.eval(), out / "model", segmentation_processor(config, preprocessing), card, overwrite=True)
    (out / "all_results.json").write_text(json.dumps(results, indent=2) + "\n")
    logger.info("results: " + json.dumps(results))
    if args.push_to_hub:
        from ..hub import push_folder

        push_folder(out / "model", args.push_to_hub)
        logger.info(f"pushed {out / 'model'} to {args.push_to_hub}")
