"""The one training loop, in the spirit of transformers' `run_image_classification_no_trainer.py`: classification
(the main command and the experiments call `fit`) and segmentation (`segmentation.py`) run through it, each as a
`Task` (its loss on a batch, its evaluation, its extra results); schedule, optimizer, resume, checkpoints, model EMA,
logging and trackers are the loop's. Everything distributed (DDP, FSDP, DeepSpeed, mixed precision) goes through
Accelerate.

Exact resumption: the sampler is seeded by (seed, epoch), each training image by (seed, epoch, index) (see
data.py), and MixUp/CutMix by (seed, step); the only stateful randomness left (dropout, stochastic depth) lives in
the global RNG that `save_state`/`load_state` carry. A resumed run replays the batches of an uninterrupted one.
A streamed run (`--streaming`) resumes from its loader's saved position instead of skipping batches.
"""

import logging
import math
import os
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import checks
from ..errors import UsageError
from .checkpoints import (
    check_recorded_options,
    discard_checkpoints,
    load_checkpoint,
    project_configuration,
    recorded_options,
    resolve_checkpoint,
    save_checkpoint,
)
from .data import make_loaders, make_mixer
from .evaluation import evaluate_each_patch_size, evaluate_model
from .model import enable_activation_checkpointing, make_optimizer
from .naflex import model_inputs
from .patch_sizes import parse_patch_sizes, sampler

logger = logging.getLogger("hubvit.finetune")


def check_fsdp(accelerator):
    """Accelerate (1.16) turns FSDP on only for GPU-like devices: on CPU `--use_fsdp` silently becomes DDP or
    independent processes, so a run that asked for FSDP and did not get it stops before training."""
    from accelerate.utils import DistributedType

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and (
        accelerator.distributed_type != DistributedType.FSDP
    ):
        raise UsageError(
            f"FSDP was requested but Accelerate set up {accelerator.distributed_type.value} on {accelerator.device.type}: "
            "Accelerate runs FSDP only on GPU/XPU/NPU/HPU devices, not on CPU (use --multi_gpu with "
            "ACCELERATE_USE_CPU=1 for DDP on CPU)"
        )


def make_accelerator(args):
    """The one Accelerator of a run (experiments reuse it for every model they fit)."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=args.mixed_precision,
        log_with=None if args.report_to == "none" else args.report_to,
        project_config=project_configuration(args),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=args.seed),
        dynamo_backend=getattr(args, "torch_compile", None),
    )
    check_fsdp(accelerator)
    return accelerator


def start_run(args):
    """What a trainer does first: its Accelerator, the trainers' log at INFO on each machine's main process only,
    the torch threads asked for, and the seed set."""
    import logging

    import torch
    from accelerate.utils import set_seed

    accelerator = make_accelerator(args)
    logger.setLevel(logging.INFO if accelerator.is_local_main_process else logging.ERROR)
    if args.cpu_threads:
        torch.set_num_threads(args.cpu_threads)
    set_seed(args.seed)
    return accelerator


@dataclass
class Schedule:
    """How long the run is, in optimizer updates and epochs."""

    updates_per_epoch: int
    max_steps: int
    num_epochs: int
    warmup: int

    @classmethod
    def plan(cls, args, batches_per_epoch):
        updates_per_epoch = math.ceil(batches_per_epoch / args.gradient_accumulation_steps)
        max_steps = args.max_train_steps or args.num_train_epochs * updates_per_epoch
        warmup = args.num_warmup_steps if args.num_warmup_steps is not None else int(args.warmup_ratio * max_steps)
        return cls(updates_per_epoch, max_steps, math.ceil(max_steps / updates_per_epoch), warmup)


@dataclass
class Position:
    """Where the loop is: updates done, the epoch, batches of it already seen (a resumed run skips them)."""

    global_step: int = 0
    epoch: int = 0
    skip_batches: int = 0


@dataclass
class Window:
    """Throughput between two log lines."""

    started: float = field(default_factory=time.time)
    images: int = 0


class Task:
    """What a trainer adds to the loop: the loss of a batch, the evaluation after an epoch and the results it adds
    at the end. `tracker` names the run for Accelerate's trackers."""

    tracker = "hubvit-finetune"
    num_labels = 0

    def loss(self, run, pixels, targets, global_step):
        raise NotImplementedError

    def evaluate(self, run):
        return {}

    def finish(self, run):
        """Results beyond the loop's own, once training is over."""
        return {}


@dataclass
class Run:
    """What one `fit` call trains with, after `accelerator.prepare`."""

    args: object
    accelerator: object
    model: object
    optimizer: object
    scheduler: object
    train_set: object
    train_loader: object
    eval_loader: object
    schedule: Schedule
    num_train: int
    task: Task = None
    ema: object = None


class Classification(Task):
    """Image classification: cross entropy (label smoothing) on MixUp/CutMix batches, one patch size drawn per
    update with `--patch_sizes`; accuracy (and the EMA's) after each epoch, and at each patch size at the end."""

    def __init__(self, mixer, draw, num_labels):
        self.mixer, self.draw, self.num_labels = mixer, draw, num_labels

    def loss(self, run, pixels, targets, global_step):
        args, accelerator = run.args, run.accelerator
        if self.mixer is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(args.seed * 1_000_003 + global_step * 97 + accelerator.process_index)
                pixels, targets = self.mixer(pixels, targets)
        logits = run.model(**model_inputs(pixels), **self.draw(global_step)).logits.float()
        return F.cross_entropy(logits, targets, label_smoothing=args.label_smoothing)

    def evaluate(self, run):
        """The model's metrics, and the EMA's as `ema_*` (evaluated under the run's autocast, as the model is)."""
        metrics = evaluate_model(run.accelerator, run.model, run.eval_loader)
        if run.ema is not None:
            with run.accelerator.autocast():
                averaged = evaluate_model(run.accelerator, run.ema.module, run.eval_loader)
            metrics.update({f"ema_{k}": v for k, v in averaged.items() if k != "eval_samples"})
        return metrics

    def finish(self, run):
        sizes = parse_patch_sizes(run.args.patch_sizes)
        by_patch_size = evaluate_each_patch_size(run.accelerator, run.model, run.eval_loader, sizes)
        return {"patch_sizes": by_patch_size} if by_patch_size else {}


def check_patch_sequences(args, config):
    """`--max_num_patches` needs a model that reads one grid per image and square patches."""
    if not getattr(args, "max_num_patches", None):
        return
    from ..modeling.naflex_hubvit import sequence_problem

    problem = sequence_problem(config)
    (ph, pw) = config.patch_size_2d
    if problem is None and ph != pw:
        problem = f"patch_size={[ph, pw]}: patch sequences are cut into square patches"
    if problem is not None:
        raise UsageError(f"--max_num_patches {args.max_num_patches} with this model: {problem}")
    from ..limits import SizeError, check_config_sizes

    try:
        check_config_sizes(
            config,
            f"--max_num_patches {args.max_num_patches}",
            num_patches=args.max_num_patches,
            batch_size=args.per_device_train_batch_size,
        )
    except SizeError as error:
        raise UsageError(str(error)) from None


def prepare(args, accelerator, train_split, eval_split, model, preprocessing, lr_scale=None):
    """Loaders, optimizer and schedule for `model`, prepared by Accelerate (`lr_scale`: see `scale_learning_rates`)."""
    num_labels = len(train_split.features[args.label_column_name].names)
    size = tuple(model.config.image_size_2d)
    streamed = getattr(args, "streaming", False)
    draw = sampler(parse_patch_sizes(args.patch_sizes), model.config, args.seed)
    check_patch_sequences(args, model.config)
    train_set, train_loader, eval_loader = make_loaders(
        args,
        train_split,
        eval_split,
        size,
        preprocessing,
        accelerator.process_index,
        accelerator.num_processes,
        patch_size=model.config.patch_size_2d[0] if getattr(args, "max_num_patches", None) else None,
    )
    if not streamed:
        train_loader = accelerator.prepare(train_loader)
    if eval_loader is not None:
        eval_loader = accelerator.prepare(eval_loader)
    num_train = train_loader.num_examples if streamed else len(train_split)
    run = assemble(args, accelerator, model, train_set, train_loader, eval_loader, num_train, lr_scale)
    run.task = Classification(make_mixer(args.mixup_alpha, args.cutmix_alpha, num_labels), draw, num_labels)
    run.ema = make_ema(args, accelerator, run.model)
    return run


def assemble(args, accelerator, model, train_set, train_loader, eval_loader, num_train, lr_scale=None):
    """The `Run` of prepared loaders: its schedule, the optimizer and learning-rate schedule, `model` prepared by
    Accelerate (with activation checkpointing where asked); the caller sets its task (and EMA)."""
    schedule = Schedule.plan(args, len(train_loader))
    optimizer = make_optimizer(args, model, lr_scale)
    scheduler = make_scheduler(args, optimizer, schedule, accelerator.num_processes)
    if getattr(args, "gradient_checkpointing", False):
        enable_checkpointing(accelerator, model)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return Run(
        args, accelerator, model, optimizer, scheduler, train_set, train_loader, eval_loader, schedule, num_train
    )


def enable_checkpointing(accelerator, model):
    """`--gradient_checkpointing` on the unwrapped model. Under FSDP, FSDP's own activation checkpointing (Accelerate's
    `fsdp_activation_checkpointing`) is the better choice, as transformers' Trainer also warns: recomputing a block
    outside FSDP's wrapper all-gathers its weights once more in the backward pass."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type == DistributedType.FSDP:
        logger.warning(
            "--gradient_checkpointing under FSDP all-gathers each block's weights again in the backward pass; "
            "fsdp_activation_checkpointing: true in the Accelerate config checkpoints without that"
        )
    enable_activation_checkpointing(model)


def make_ema(args, accelerator, model):
    """The model EMA (`--ema_decay`) of the prepared model, or None. FSDP shards the weights it would average."""
    from accelerate.utils import DistributedType

    decay = getattr(args, "ema_decay", None)
    if not decay:
        return None
    if accelerator.distributed_type == DistributedType.FSDP:
        raise UsageError("--ema_decay averages whole weights, which FSDP shards; use DDP or DeepSpeed ZeRO-2")
    from .ema import model_ema

    return model_ema(accelerator.unwrap_model(model), decay)


def start_trackers(run):
    if run.args.report_to != "none":
        hparams = {
            k: v for k, v in vars(run.args).items() if isinstance(v, (int, float, str, bool)) and not k.startswith("_")
        }
        run.accelerator.init_trackers(run.task.tracker, config=hparams)


def resume(run):
    """The position to start from: the checkpoint's when resuming, else the beginning."""
    args = run.args
    if not args.resume_from_checkpoint:
        if getattr(args, "overwrite_output_dir", False):
            discard_checkpoints(run.accelerator, args.output_dir)
        return Position()
    path = resolve_checkpoint(args.resume_from_checkpoint, args.output_dir)
    check_recorded_options(path, args)
    global_step, epoch, skip = load_checkpoint(run.accelerator, path, streamed_loader(run), run.ema)
    checks.check_resume(global_step, run.schedule.max_steps, path)
    if skip >= len(run.train_loader):
        epoch, skip = epoch + 1, 0
    logger.info(f"resumed from {path} at update {global_step} (epoch {epoch}, batch {skip})")
    return Position(global_step, epoch, skip)


def streamed_loader(run):
    """The train loader when it streams (its position is part of a checkpoint), else None."""
    return run.train_loader if getattr(run.args, "streaming", False) else None


def describe(run):
    args, accelerator, schedule = run.args, run.accelerator, run.schedule
    batch_size = args.per_device_train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
    num_eval = 0 if run.eval_loader is None else len(run.eval_loader.dataset)
    logger.info(
        f"{run.num_train} training / {num_eval} eval images, {run.task.num_labels} classes; "
        f"{accelerator.num_processes} process(es), batch {batch_size}, {schedule.max_steps} updates over "
        f"{schedule.num_epochs} epochs, {sum(p.numel() for p in run.model.parameters()) / 1e6:.2f}M parameters"
    )


def train_step(run, pixels, targets, global_step):
    """One forward/backward of the task's loss (an optimizer update when the accumulation is complete): the one
    place every trainer's gradients are computed. Returns the loss."""
    args, accelerator, model = run.args, run.accelerator, run.model
    with accelerator.accumulate(model):
        loss = run.task.loss(run, pixels, targets, global_step)
        accelerator.backward(loss)
        if accelerator.sync_gradients and args.max_grad_norm:
            accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad()
    return loss


def log_step(run, loss, window, epoch_fraction, global_step, progress):
    rate = window.images / max(time.time() - window.started, 1e-9)
    logs = {
        "train_loss": loss.item(),
        "lr": run.scheduler.get_last_lr()[-1],
        "images_per_second": rate,
        "epoch": epoch_fraction,
    }
    progress.set_postfix(loss=f"{logs['train_loss']:.3f}", lr=f"{logs['lr']:.2e}", img_s=f"{rate:.0f}")
    run.accelerator.log(logs, step=global_step)


def checkpoint(run, position, batches_in_epoch):
    state = {"global_step": position.global_step, "epoch": position.epoch, "batches_in_epoch": batches_in_epoch}
    state.update(recorded_options(run.args))
    logger.info(f"saved checkpoint {save_checkpoint(run.accelerator, state, streamed_loader(run), run.ema)}")


def train_epoch(run, position, progress, window):
    """One epoch (or its rest, after a resume) of updates, logging and step checkpoints; moves `position`."""
    args, accelerator = run.args, run.accelerator
    every = int(args.checkpointing_steps) if args.checkpointing_steps not in (None, "epoch") else None
    if hasattr(run.train_set, "set_epoch"):  # the images' augmentation draws (segmentation: fresh canvases)
        run.train_set.set_epoch(position.epoch)
    run.train_loader.set_epoch(position.epoch)
    loader, batches = run.train_loader, 0
    if position.skip_batches:
        if streamed_loader(run) is None:
            loader = accelerator.skip_first_batches(run.train_loader, position.skip_batches)
        batches, position.skip_batches = position.skip_batches, 0
    for pixels, targets in loader:
        pixels, targets = pixels.to(accelerator.device), targets.to(accelerator.device)
        loss = train_step(run, pixels, targets, position.global_step)
        batches += 1
        window.images += pixels.shape[0] * accelerator.num_processes
        if not accelerator.sync_gradients:
            continue
        position.global_step += 1
        if run.ema is not None:
            from .ema import update_ema

            update_ema(run.ema, accelerator.unwrap_model(run.model))
        progress.update(1)
        if position.global_step % args.logging_steps == 0 or position.global_step == run.schedule.max_steps:
            log_step(
                run, loss, window, position.epoch + batches / len(run.train_loader), position.global_step, progress
            )
            window.started, window.images = time.time(), 0
        if every and position.global_step % every == 0:
            checkpoint(run, position, batches)
        if position.global_step >= run.schedule.max_steps:
            break
    return batches


def end_of_epoch(run, position, batches):
    """Evaluate (when there is an eval split) and checkpoint (with `--checkpointing_steps epoch`)."""
    metrics = {}
    if run.eval_loader is not None:
        metrics = run.task.evaluate(run)
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        logger.info(f"epoch {position.epoch}: " + ", ".join(f"{k} {v:.4f}" for k, v in scalars.items()))
        run.accelerator.log({k: v for k, v in scalars.items() if k != "eval_samples"}, step=position.global_step)
    if run.args.checkpointing_steps == "epoch":
        checkpoint(run, position, batches)
    return metrics


def results(run, metrics, global_step, train_runtime, extra):
    schedule, accelerator = run.schedule, run.accelerator
    seen = run.num_train * (schedule.max_steps / schedule.updates_per_epoch)
    return {
        **metrics,
        "train_runtime_s": round(train_runtime, 2),
        "num_processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision,
        "train_samples": run.num_train,
        "global_step": global_step,
        "epochs": schedule.num_epochs,
        "train_images_per_second": round(seen / max(train_runtime, 1e-9), 1),
        **extra,
    }


def fit(args, accelerator, train_split, eval_split, model, preprocessing):
    """Train `model` on `train_split` with the recipe in `args`, evaluating on `eval_split` after every epoch.

    With `eval_split=None` nothing is evaluated (the experiments evaluate the returned model themselves).
    `preprocessing` is a `Preprocessing` (normalisation and resample filter). Returns the prepared model and the
    final results (metrics of the last evaluation, runtime, throughput). Any model whose `config` has
    `image_size_2d` and `num_hidden_layers` and whose forward takes `pixel_values` and returns `.logits` fits
    (the inductive-bias experiment's CNN does). With `args.patch_sizes` each update runs at a patch size drawn from
    them (FlexiViT; `patch_sizes.sampler`), and the results gain the evaluation at each size (`patch_sizes`).
    """
    run, metrics = fit_run(args, accelerator, train_split, eval_split, model, preprocessing)
    return run.model, metrics


def fit_run(args, accelerator, train_split, eval_split, model, preprocessing):
    """`fit`, returning the whole `Run` (its model EMA included) rather than the model alone."""
    run = prepare(args, accelerator, train_split, eval_split, model, preprocessing)
    return train(run)


def train(run):
    """Train a prepared `run` to its schedule (resuming where asked), evaluating after every epoch; returns the run
    and its results."""
    from tqdm.auto import tqdm

    accelerator = run.accelerator
    start_trackers(run)
    position = resume(run)
    describe(run)
    progress = tqdm(
        total=run.schedule.max_steps,
        initial=position.global_step,
        disable=not accelerator.is_local_main_process,
        desc="training",
    )
    started, window, metrics = time.time(), Window(), {}
    run.model.train()
    try:
        while position.epoch < run.schedule.num_epochs:
            batches = train_epoch(run, position, progress, window)
            metrics = end_of_epoch(run, position, batches) or metrics
            if position.global_step >= run.schedule.max_steps:
                break
            position.epoch += 1
        progress.close()
        train_runtime = time.time() - started
        if not metrics and run.eval_loader is not None:
            metrics = run.task.evaluate(run)
        extra = run.task.finish(run)
    except Exception as error:
        checks.release_worker_error(error)
        raise
    return run, results(run, metrics, position.global_step, train_runtime, extra)


def make_scheduler(args, optimizer, schedule, processes):
    """transformers' learning-rate schedule for `schedule`; a prepared scheduler steps once per process per update
    (accelerate's AcceleratedScheduler), so its step counts are scaled by the process count."""
    from transformers import get_scheduler

    return get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=schedule.warmup * processes,
        num_training_steps=schedule.max_steps * processes,
    )
