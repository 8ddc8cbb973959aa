"""`train`: one whole run (data, model, loop, the hubvit folder, results), the function under `hubvit train`."""

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path


from .arguments import Arguments, apply_named_recipe, resolve_defaults
from .option_checks import check_args, check_types
from .data import load_run_splits
from .loop import fit_run, logger, start_run
from .patch_sizes import ACCURACY_FILE, write_accuracy


@dataclass
class TrainingResult:
    """What a run leaves: OUTPUT_DIR, the hubvit folder in it, and all_results.json's metrics. `eval_dataset` is
    the held-out split the metrics were computed on (not serialised; scripts draw figures from it)."""

    output_dir: Path
    model_dir: Path
    metrics: dict
    eval_dataset: object = dataclasses.field(default=None, repr=False)


def python_call(args):
    """The `hubvit.train(...)` call that repeats a run: the options that differ from their defaults (a recipe's
    values written out)."""
    defaults = Arguments()
    changed = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(args)
        if getattr(args, f.name) != getattr(defaults, f.name)
    }
    return "hubvit.train(" + ", ".join(f"{k}={v!r}" for k, v in changed.items()) + ")"


def train(*groups, command=None, **options):
    """Fine-tune (or train from scratch) a hubvit image classifier; returns a `TrainingResult`.

    `groups`: any of `DataArguments`, `ModelArguments`, `TrainingArguments`, `OutputArguments` (or one
    `Arguments`); `options`: the same fields by keyword, e.g. `train(output_dir="out", max_train_steps=100)`.
    Bad input raises `UsageError` (a `hubvit.HubViTError`, so a `ValueError`) before any training starts.
    `command` is the line the model card cites (default: this call, written out).
    """
    started = time.time()
    args = Arguments.build(*groups, **options)
    check_types(args)  # before a recipe computes with the values
    apply_named_recipe(args)
    resolve_defaults(args)
    check_args(args)
    accelerator = start_run(args)
    with accelerator.main_process_first():
        train_split, eval_split, source, eval_name = load_run_splits(args)
    from .model import load_model

    model, preprocessing = load_model(args, train_split.features[args.label_column_name].names)
    run, results = fit_run(args, accelerator, train_split, eval_split, model, preprocessing)
    results["total_runtime_s"] = round(time.time() - started, 2)
    export(accelerator, args, run, results, (source, eval_name), preprocessing, command or python_call(args))
    accelerator.end_training()
    out = Path(args.output_dir)
    return TrainingResult(out, out / "model", results, eval_split)


def model_card(args, results, data, command):
    from ..card import CardInfo

    base = args.model_name_or_path
    source, eval_name = data
    provenance = (f"Fine-tuned from `{base}`" if base else f"Trained from scratch (preset `{args.model_size}`)") + (
        f" on {source}: {results['train_samples']} training images, {results['eval_samples']} held out, "
        f"{results['epochs']} epochs on {results['num_processes']} process(es) with hubvit's training package"
        f" ({args.optimizer}, lr {args.learning_rate:g}, {args.lr_scheduler_type} schedule)."
    )
    if results.get("patch_sizes"):
        provenance += (
            f' Each update ran at a patch size drawn from {args.patch_sizes} (FlexiViT, "FlexiViT: One Model for All '
            'Patch Sizes", Beyer et al., CVPR 2023): the stored kernel PI-resized on the fly. Accuracy at each size: '
            + ", ".join(f"P={size} {m['eval_accuracy']:.4f}" for size, m in results["patch_sizes"].items())
            + f" (also in `{ACCURACY_FILE}`, which `hubvit info --patch-sizes` shows)."
        )
    if args.max_num_patches:
        provenance += (
            f" Each image was seen at its own aspect ratio, resized to the largest size of at most "
            f"{args.max_num_patches} whole patches (SigLIP 2's NaFlex rule), as a padded patch sequence; the folder's "
            "image processor does the same."
        )
    return CardInfo(
        provenance=provenance,
        command=command,
        family="fine-tuned" if base else "trained-from-scratch",
        eval_results={k: results[k] for k in ("eval_accuracy", "eval_top5_accuracy")},
        eval_split=eval_name,
        datasets=[args.dataset_name] if args.dataset_name and not Path(args.dataset_name).exists() else [],
        base_model=base if base and not Path(base).exists() else None,
        repo_id=args.push_to_hub or "REPO_ID",
    )


def ema_results(results):
    """The results as the EMA's card states them: its own accuracy in place of the trained weights'."""
    return {**results, **{k[len("ema_") :]: v for k, v in results.items() if k.startswith("ema_")}}


def export(accelerator, args, run, results, data, preprocessing, command):
    """Write OUTPUT_DIR/model (the one hubvit folder writer), OUTPUT_DIR/model_ema with `--ema_decay`,
    all_results.json, and push the model when asked."""
    from ..folder import build_model, make_image_processor, write_folder

    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(run.model)
    if not accelerator.is_main_process:
        return
    config = accelerator.unwrap_model(run.model).config
    final = build_model(config, {k: v.detach().cpu() for k, v in state_dict.items()})
    processor = make_image_processor(config, preprocessing.mean, preprocessing.std, preprocessing.resample)
    if args.max_num_patches:
        from ..preprocessing import patch_budget_processor

        patch = config.patch_size_2d[0]
        processor = patch_budget_processor(
            patch, args.max_num_patches, preprocessing.resample, preprocessing.mean, preprocessing.std
        )
    out = Path(args.output_dir)
    folder = write_folder(final, out / "model", processor, model_card(args, results, data, command), overwrite=True)
    if run.ema is not None:
        averaged = build_model(config, {k: v.detach().cpu() for k, v in run.ema.module.state_dict().items()})
        card = model_card(args, ema_results(results), data, command)
        card.provenance += f" Exponential moving average of the weights (decay {args.ema_decay:g})."
        write_folder(averaged, out / "model_ema", processor, card, overwrite=True)
    (out / "all_results.json").write_text(json.dumps(results, indent=2) + "\n")
    write_accuracy(folder, results, data[1], command)
    logger.info("results: " + json.dumps(results))
    if args.push_to_hub:
        from ..hub import push_folder

        push_folder(folder, args.push_to_hub)
        logger.info(f"pushed {folder} to {args.push_to_hub}")
