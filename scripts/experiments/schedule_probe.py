"""One digits fit of the position-embedding experiment's ViT, timed: which schedule reaches the accuracy the
comparison needs, and how fast a unit trains at a given thread count (docs/experiments/campaign.md).

    python scripts/experiments/schedule_probe.py --threads 1 --max_epochs 30 --augment none --patience 5
    python scripts/experiments/schedule_probe.py --threads 2 --max_epochs 3 --min_epochs 3 --augment affine
    python scripts/experiments/schedule_probe.py --precision_steps 10 --image_size 56   # float32 vs bfloat16
"""

import argparse
import copy
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts.experiments import common  # noqa: E402


def epoch_of_batches(run):
    started = time.time()
    run.train_set.set_epoch(0)
    run.train_loader.set_epoch(0)
    for _ in run.train_loader:
        pass
    return time.time() - started


def step_milliseconds(model, image_size, bfloat16, steps):
    """Milliseconds per AdamW training step on a batch of 64, in float32 or under bfloat16 autocast (3 untimed
    warm-up steps first)."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), 2e-3)
    pixels = torch.randn(64, model.config.num_channels, image_size, image_size)
    labels = torch.randint(0, model.config.num_labels, (64,))
    for step in range(steps + 3):
        if step == 3:
            started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
            loss = model(pixel_values=pixels, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return 1000 * (time.perf_counter() - started) / steps


def compare_precisions(model, image_size, steps, rounds=2):
    """float32 and bfloat16 steps of copies of one model, alternated `rounds` times so both see the same load."""
    from hubvit.cpu import cpu_isa

    times = {"float32": [], "bfloat16": []}
    for _ in range(rounds):
        for name in times:
            times[name].append(step_milliseconds(copy.deepcopy(model), image_size, name == "bfloat16", steps))
    return {"isa": cpu_isa(), **times}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--kind", default="learned", help="position_embedding_type")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--augment", default="none", choices=["none", "affine"])
    p.add_argument("--max_epochs", type=int, default=30)
    p.add_argument("--patience", type=int, default=5)
    p.add_argument("--min_epochs", type=int, default=10)
    p.add_argument("--output_dir", default="/tmp/schedule_probe")
    p.add_argument(
        "--loader_only",
        action="store_true",
        help="instead of training: seconds for one epoch of training batches, decoded per epoch and kept in memory",
    )
    p.add_argument(
        "--precision_steps",
        type=int,
        default=0,
        help="instead of training: ms per training step in float32 and under bfloat16 autocast, over this many steps",
    )
    p.add_argument("--image_size", type=int, default=28, help="digits enlarged to this size (56: attention_distance)")
    options = p.parse_args(argv)
    common.setup_quietly(options.threads)
    accelerator = common.accelerator_for(options.output_dir)
    train, validation, test = common.digits_train_validation_test()
    args = common.training_args(
        options.output_dir, options.seed, augment=options.augment, image_size=options.image_size
    )
    model, preprocessing = common.build_vit(
        args, train.features["label"].names, {"position_embedding_type": options.kind}
    )
    if options.precision_steps:
        measured = compare_precisions(model.train(), options.image_size, options.precision_steps)
        print(
            f"{options.kind} at {options.image_size} x {options.image_size}, {options.threads} thread(s), CPU "
            f"{measured['isa']}: ms per training step (batch 64), float32 "
            f"{', '.join(f'{t:.0f}' for t in measured['float32'])}; bfloat16 autocast "
            f"{', '.join(f'{t:.0f}' for t in measured['bfloat16'])}",
            flush=True,
        )
        return 0
    if options.loader_only:
        run = common.prepare_run(args, accelerator, train, model, preprocessing)
        times = [epoch_of_batches(run)]
        started = time.time()
        kept = common.keep_in_memory(run, train, preprocessing, (options.image_size, options.image_size))
        setup = time.time() - started
        if kept:
            times.append(epoch_of_batches(run))
        print(
            f"{len(train)} images, batches of one epoch: decoded each epoch {times[0]:.2f} s"
            + (f"; in memory {times[1]:.2f} s (after {setup:.2f} s once)" if kept else " (augmented: not kept)"),
            flush=True,
        )
        return 0
    plateau = common.Plateau(
        max_epochs=options.max_epochs, patience=options.patience, min_epochs=min(options.min_epochs, options.max_epochs)
    )
    started = time.time()
    model, record = common.fit_to_plateau(accelerator, args, train, validation, model, preprocessing, plateau)
    pixels, labels = common.eval_tensors(test, preprocessing, (options.image_size, options.image_size))
    print(
        f"{options.kind} seed {options.seed}, {options.threads} thread(s), augment {options.augment}: test "
        f"{common.accuracy(common.predict(model, pixels), labels):.4f} after {record['epochs']} epochs "
        f"({record['stopped_by']}), {time.time() - started:.1f} s (validation scoring {record['eval_seconds']} s); "
        f"validation {[round(h, 3) for h in record['validation_history']]}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
