"""What every experiment shares: data splits, the ViT they train, the call into the main command's `fit`, writing.

Each experiment builds its training arguments with the Python API (`hubvit.training.Arguments`, the dataclasses
`hubvit train` parses), so a model here is trained exactly as `scripts/finetune.py` would train it with the same
options, by the same loop.
"""

import argparse
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hubvit.cpu import cpu_isa, cpu_model
from scripts.experiments.pages import (  # noqa: F401 (the experiments read them as common.*)
    command,
    environment,
    write,
    pyplot,
    SCHEDULE_NOTE,
    pct,
    campaign_text,
    header,
)
from scripts.experiments.fit_state import (  # noqa: F401 (the experiments read them as common.*)
    save_atomically,
    load_checkpoint,
    rng_states,
    set_rng_states,
    write_json_atomically,
)
from scripts.experiments.statistics import (  # noqa: F401 (the experiments read them as common.*)
    DEFAULT_SEEDS,
    REQUIRED_SEEDS,
    gather,
    minutes_per_run,
    seed_counts,
    undecided,
    decide,
    paired_difference,
    paired,
    interval_text,
    equivalence,
    resolvable_margin,
    mean_std,
    interval_cell,
)

logger = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "experiments"
# The experiments' ViT: the main command's default preset (4 heads, mean pooling) with 4-px patches, so 28 x 28
# digits give a 7 x 7 grid where geometry matters, narrowed to 64 wide and 4 blocks so that a run takes a minute or two
# on a CPU core.
VIT_FIELDS = dict(patch_size=4, hidden_size=64, intermediate_size=128, num_hidden_layers=4)


def fields_text(fields):
    """Config fields as the reports print them: `name=value,...`."""
    return ",".join(f"{k}={v}" for k, v in fields.items())


VIT_OVERRIDES = fields_text(VIT_FIELDS)
VALIDATION_SIZE = 600


def parser(description, quick_help="a tiny run (seconds to a minute) for the tests: structure, not accuracy"):
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--output_dir", default=str(DOCS), help="where the JSON, PNG and markdown go (default docs/experiments)"
    )
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--seeds", type=int, help=f"number of seeds (default {DEFAULT_SEEDS}; 1 with --quick)")
    p.add_argument("--cpu_threads", type=int, help="torch threads (default: OMP_NUM_THREADS or torch's choice)")
    p.add_argument("--first_seed", type=int, default=0, help="seeds are first_seed, first_seed + 1, ...")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="instead of training, pool the runs of these results "
        "files (the same experiment run with different --first_seed, side by side) and write the report",
    )
    return p


def setup_quietly(threads=None):
    """Thread count; datasets' and transformers' own progress and warnings off (a script's entry point only)."""
    import datasets
    import transformers

    if threads:
        torch.set_num_threads(threads)
    datasets.utils.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    os.environ.setdefault("TQDM_DISABLE", "1")


def setup(options):
    """Seeds list, quiet logging, thread count; returns the seeds."""
    setup_quietly(options.cpu_threads)
    Path(options.output_dir).mkdir(parents=True, exist_ok=True)
    count = options.seeds or (1 if options.quick else DEFAULT_SEEDS)
    return list(range(options.first_seed, options.first_seed + count))


def concatenate(parts):
    """Nested dicts of per-seed lists, pooled: lists are joined in order, dicts merged key by key."""
    first = parts[0]
    if isinstance(first, dict):
        return {key: concatenate([part[key] for part in parts]) for key in first}
    if isinstance(first, list):
        return [item for part in parts for item in part]
    return first


def merged(paths):
    """One results dict from the results files of runs of one experiment over different seeds."""
    parts = [json.loads(Path(path).read_text()) for path in paths]
    results = dict(parts[0])
    if len({json.dumps(part["setup"], sort_keys=True) for part in parts}) != 1:
        raise SystemExit(f"--merge: the runs in {paths} differ in their setup; only seeds may differ")
    results["runs"] = concatenate([part["runs"] for part in parts])
    results["command"] = " ; ".join([part["command"] for part in parts] + [command(results["name"])])
    results["environment"] = dict(
        parts[0]["environment"],
        wall_time_s=max(p["environment"]["wall_time_s"] for p in parts),
        parallel_parts=len(parts),
        load_average_at_end=max((p["environment"]["load_average_at_end"] for p in parts)),
    )
    return results


def training_args(output_dir, seed, **options):
    """The main command's arguments (its defaults and recipe) for one run of the experiment, built with the Python
    API: `options` are fields of `hubvit.training.Arguments`."""
    from hubvit import training

    args = training.Arguments.build(output_dir=str(output_dir), seed=seed, logging_steps=1_000_000, **options)
    return training.resolve_defaults(args)


def accelerator_for(output_dir):
    from hubvit import training

    return training.make_accelerator(training_args(output_dir, 0))


def build_vit(args, label_names, fields=None):
    """The main command's model from its preset, with VIT_FIELDS and the experiment's `fields` (seeded by
    `args.seed`); returns (model, Preprocessing)."""
    from accelerate.utils import set_seed

    from hubvit import training

    set_seed(args.seed)
    return training.load_model(args, label_names, config_fields={**VIT_FIELDS, **(fields or {})})


def fit(accelerator, args, train, test, model, preprocessing):
    """The main command's training loop; returns the unwrapped model in eval mode and fit's results."""
    from accelerate.utils import set_seed

    from hubvit import training

    set_seed(args.seed)
    model, results = training.fit(args, accelerator, train, test, model, preprocessing)
    model = accelerator.unwrap_model(model).eval()
    accelerator.free_memory()
    return model, results


def digits_splits(quick=False):
    """The main command's 5,000 embedded MNIST digits, split once (stratified, seed 0): 4,000 train / 1,000 test.

    The split is the same for every seed and every experiment; nothing is tuned on it.
    """
    from hubvit import training

    parts = training.embedded_digits().train_test_split(test_size=0.2, seed=0, stratify_by_column="label")
    train, test = parts["train"], parts["test"]
    if quick:
        train, test = train.select(range(300)), test.select(range(200))
    return train, test


def digits_train_validation_test(quick=False):
    """`digits_splits`' 4,000 training digits carved once more (stratified, seed 0) into 3,400 train / 600
    validation; the 1,000 test digits are the same as every other experiment's. The plateau and the checkpoint are
    chosen on validation; test is evaluated once, at the end."""
    train, test = digits_splits(quick)
    size = 100 if quick else VALIDATION_SIZE
    parts = train.train_test_split(test_size=size, seed=0, stratify_by_column="label")
    return parts["train"], parts["test"], test


@dataclass(frozen=True)
class Plateau:
    """When a run stops: after the first epoch at which the best validation accuracy of the last `patience` epochs is
    not more than `min_delta` above the best before them (at least `min_epochs` epochs), or at `max_epochs`. The
    learning-rate schedule (the main command's cosine with warmup) spans `max_epochs`; the weights kept are those of
    the epoch with the best validation accuracy (the earliest among ties)."""

    max_epochs: int = 30
    patience: int = 5
    min_delta: float = 0.003
    min_epochs: int = 10

    def text(self):
        return (
            f"validation accuracy checked after every epoch; stop when the last {self.patience} epochs do not "
            f"beat the best before them by more than {100 * self.min_delta:.1f} points (at least "
            f"{self.min_epochs} epochs), or at the cap of {self.max_epochs} epochs (the cosine schedule spans "
            "the cap); the best-validation weights are kept and the test set is evaluated once with them"
        )

    def reached(self, history):
        if len(history) < max(self.min_epochs, self.patience + 1):
            return False
        return max(history[-self.patience :]) <= max(history[: -self.patience]) + self.min_delta


QUICK_PLATEAU = Plateau(max_epochs=1, patience=1, min_delta=0.0, min_epochs=1)


def prepare_run(args, accelerator, train, model, preprocessing, lr_scale=None):
    """`hubvit.training.loop.prepare` with no eval loader (validation is scored per epoch by the caller) and the
    learning rate of the parameters whose name contains a key of `lr_scale` multiplied by its value."""
    from hubvit.training import loop

    return loop.prepare(args, accelerator, train, None, model, preprocessing, lr_scale=lr_scale)


def _item_in_memory(self, index):
    return self.pixels[index], int(self.labels[index])


def deterministic_transform(args):
    return args.augment == "none" and not args.randaugment and not args.random_erasing


def keep_in_memory(run, split, preprocessing, size):
    """Decode and transform the training images once instead of every epoch: only for a deterministic training
    transform (no augmentation), whose output then equals what it gives every epoch, so the batches are the same."""
    if not deterministic_transform(run.args) or getattr(run.args, "max_num_patches", None):
        return False
    pixels, labels = eval_tensors(split, preprocessing, size)
    data = run.train_set
    data.__class__ = type("ImagesInMemory", (type(data),), {"__getitem__": _item_in_memory})
    data.pixels, data.labels = pixels, labels
    loader = getattr(run.train_loader, "base_dataloader", run.train_loader)  # accelerate's wrapper reads from it
    loader.num_workers = 0  # a loader process would only copy tensors; the sampler's order is the same
    return True


def fit_to_plateau(
    accelerator,
    args,
    train,
    validation,
    model,
    preprocessing,
    plateau,
    lr_scale=None,
    checkpoint=None,
    eval_every=1,
    score=None,
):
    """Train with the main command's update step (`hubvit.training.loop.train_epoch`) one epoch at a time until
    `plateau` says stop; returns the best-validation model (unwrapped, eval mode) and a record of the run:
    epochs run, updates run, the best epoch and its updates, its validation accuracy, the per-epoch history, and
    whether the plateau or the cap stopped it. With `eval_every` > 1, validation is scored after every
    `eval_every`-th epoch (and the last) only, and `plateau` counts its patience and minimum in those scores: a
    run on a small subset, whose epochs are a few updates each, then checks as often per update as a full run.
    `score(model, pixels, labels)` replaces the validation accuracy (a model trained at several patch sizes is
    scored at all of them).

    With `checkpoint` (a file path), the whole state (model, optimizer, schedule, plateau history, best weights,
    RNG states, epoch) is saved there after every epoch, and a call that finds it resumes exactly where it
    stopped: a unit of the campaign cut short by the end of a session loses one epoch at most. A finished fit
    leaves its best weights and record there, so that a caller interrupted later does not train it again; the
    caller deletes the file when it no longer needs it.
    """
    from accelerate.utils import set_seed
    from hubvit.training import loop
    from tqdm.auto import tqdm

    set_seed(args.seed)
    args.max_train_steps, args.num_train_epochs = None, plateau.max_epochs
    started = time.time()
    size = tuple(model.config.image_size_2d)
    run = prepare_run(args, accelerator, train, model, preprocessing, lr_scale)
    in_memory = keep_in_memory(run, train, preprocessing, size)
    inner = accelerator.unwrap_model(run.model)
    saved = load_checkpoint(checkpoint) if checkpoint and Path(checkpoint).is_file() else None
    if saved is not None and saved.get("finished"):
        inner.load_state_dict(saved["best_state"])
        return inner.eval(), saved["record"]
    pixels, labels = eval_tensors(validation, preprocessing, size, patch_budget(args, model))
    position, progress, history = loop.Position(), tqdm(disable=True), []
    best_state, best_index, best_epoch, stopped, spent, evaluating = None, -1, 0, "cap", 0.0, 0.0
    if saved is not None:
        inner.load_state_dict(saved["model"])
        run.optimizer.load_state_dict(saved["optimizer"])
        run.scheduler.load_state_dict(saved["scheduler"])
        position = loop.Position(global_step=saved["global_step"], epoch=saved["epoch"])
        history, best_state = saved["history"], saved["best_state"]
        best_index = saved.get("best_index", saved["best_epoch"])  # states saved before eval_every: 0-based epoch
        best_epoch = saved["best_epoch"] if "best_index" in saved else saved["best_epoch"] + 1
        spent, evaluating = saved["seconds"], saved["eval_seconds"]
        set_rng_states(saved["rng"])
        logger.info("resumed %s after epoch %d", checkpoint, position.epoch)
    run.model.train()
    while position.epoch < plateau.max_epochs:
        loop.train_epoch(run, position, progress, loop.Window())
        position.epoch += 1
        if position.epoch % eval_every and position.epoch < plateau.max_epochs:
            continue
        scored = time.time()
        history.append(score(inner, pixels, labels) if score else accuracy(predict(inner, pixels), labels))
        evaluating += time.time() - scored
        inner.train()
        if best_state is None or history[-1] > history[best_index]:
            best_index, best_epoch = len(history) - 1, position.epoch
            best_state = {k: v.detach().clone() for k, v in inner.state_dict().items()}
        if plateau.reached(history):
            stopped = "plateau"
            break
        if checkpoint and position.epoch < plateau.max_epochs:
            save_atomically(
                {
                    "model": inner.state_dict(),
                    "optimizer": run.optimizer.state_dict(),
                    "scheduler": run.scheduler.state_dict(),
                    "global_step": position.global_step,
                    "epoch": position.epoch,
                    "history": history,
                    "best_state": best_state,
                    "best_index": best_index,
                    "best_epoch": best_epoch,
                    "seconds": spent + time.time() - started,
                    "eval_seconds": evaluating,
                    "rng": rng_states(),
                },
                checkpoint,
            )
    inner.load_state_dict(best_state)
    accelerator.free_memory()
    record = {
        "epochs": position.epoch,
        "updates": position.global_step,
        "best_epoch": best_epoch,
        "best_updates": best_epoch * run.schedule.updates_per_epoch,
        "validation_accuracy": history[best_index],
        "validation_history": history,
        **({"evaluated_every_epochs": eval_every} if eval_every != 1 else {}),
        "stopped_by": stopped,
        "train_seconds": round(spent + time.time() - started, 1),
        "eval_seconds": round(evaluating, 1),
        "images_in_memory": in_memory,
    }
    if checkpoint:
        save_atomically({"finished": True, "best_state": best_state, "record": record}, checkpoint)
    return inner.eval(), record


TIMING_KEYS = ("train_seconds", "eval_seconds", "unit_seconds", "minutes")


class Context:
    """What every unit of one experiment shares in one process (splits, test tensors, the Accelerator), built on
    first use by the experiment's `build`, so that a runner going through many units pays for it once."""

    def __init__(self, options):
        self.options = options
        self._accelerator = None
        self.build()

    def build(self):
        pass

    @property
    def accelerator(self):
        if self._accelerator is None:
            self._accelerator = accelerator_for(self.options.output_dir)
        return self._accelerator


def run_experiment(experiment, argv=None):
    """An experiment module's `main`: every (seed, arm) unit in this process, then its page (`report`, `figure`,
    `markdown`) written by the main process."""
    options = experiment.parse_args(argv)
    started = time.time()
    seeds = setup(options)
    context = experiment.Context(options)
    records = [experiment.run_unit(options, arm, seed, context) for seed in seeds for arm in experiment.ARMS]
    results = experiment.report(records, command(experiment.NAME, argv), environment(started))
    if context.accelerator.is_main_process:
        write(options.output_dir, experiment.NAME, results, experiment.figure(results), experiment.markdown(results))
    return 0


def checkpoint_file(folder, name):
    return None if folder is None else Path(folder) / f"{name}.pt"


def fit_summary(fitted):
    """What a unit keeps of a `fit_to_plateau` record besides the values its experiment reports."""
    keys = ("epochs", "updates", "best_epoch", "validation_accuracy", "validation_history", "stopped_by")
    return {k: fitted[k] for k in keys} | {k: fitted[k] for k in ("train_seconds", "eval_seconds") if k in fitted}


def unit_record(experiment, arm, seed, quick, setup, values, fits, extra=None):
    """The JSON-able record of one finished (experiment, arm, seed) unit: the setup it ran under (units are pooled
    only when it is the same), the per-seed values its experiment reports, its fits (`fit_summary`), its minutes
    of training (the fits' seconds, resumed parts added), and where it ran."""
    return {
        "experiment": experiment,
        "arm": arm,
        "seed": seed,
        "quick": quick,
        "setup": setup,
        "values": values,
        "fits": fits,
        "minutes": round(sum(f.get("train_seconds", 0.0) for f in fits.values()) / 60, 2),
        **(extra or {}),
        "environment": {
            "cpu_model": cpu_model(),
            "cpu_isa": cpu_isa(),
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "torch": torch.__version__,
        },
    }


def patch_budget(args, model):
    """(patch size, max_num_patches) of a NaFlex run (`--max_num_patches`), else None."""
    budget = getattr(args, "max_num_patches", None)
    return (model.config.patch_size_2d[0], budget) if budget else None


def eval_tensors(dataset, preprocessing, size, budget=None):
    """The evaluation transform of the main command (for a `Preprocessing`) applied to every image: (pixels, labels).
    With a `patch_budget`, each image at its own aspect ratio: the pixels are one `PatchSequences` batch."""
    from hubvit import training
    from hubvit.training.naflex import Patchified, collate_sequences

    _, eval_tf = training.make_transforms(tuple(size), preprocessing, "none", patch_budget=budget)
    labels = torch.tensor(dataset["label"])
    if budget is not None:
        cut = Patchified(eval_tf, budget[0])
        return collate_sequences([(cut(image.convert("RGB")), 0) for image in dataset["image"]])[0], labels
    pixels = torch.stack([eval_tf(image.convert("RGB")) for image in dataset["image"]])
    return pixels, labels


@torch.no_grad()
def predict(model, pixels, batch_size=250):
    """Logits for whole images (a tensor) or patch sequences (`PatchSequences`), `batch_size` at a time."""
    from hubvit.training.naflex import model_inputs

    model.eval()
    return torch.cat(
        [model(**model_inputs(pixels[i : i + batch_size])).logits.float() for i in range(0, len(pixels), batch_size)]
    )


def accuracy(logits, labels):
    return (logits.argmax(-1) == labels).float().mean().item()
