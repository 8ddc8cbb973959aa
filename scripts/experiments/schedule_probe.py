"""One digits fit of the position-embedding experiment's ViT, timed: which schedule reaches the accuracy the
comparison needs, and how fast a unit trains at a given thread count (docs/experiments/campaign.md).

    python scripts/experiments/schedule_probe.py --threads 1 --max_epochs 30 --augment none --patience 5
    python scripts/experiments/schedule_probe.py --threads 2 --max_epochs 3 --min_epochs 3 --augment affine
"""

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hubvit.scripts.experiments import common  # noqa: E402


def epoch_of_batches(run):
    started = time.time()
    run.train_set.set_epoch(0)
    run.train_loader.set_epoch(0)
    for _ in run.train_loader:
        pass
    return time.time() - started


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
    options = p.parse_args(argv)
    common.setup_quietly(options.threads)
    accelerator = common.accelerator_for(options.output_dir)
    train, validation, test = common.digits_train_validation_test()
    args = common.training_args(options.output_dir, options.seed, augment=options.augment)
    model, preprocessing = common.build_vit(
        args, train.features["label"].names, {"position_embedding_type": options.kind}
    )
    if options.loader_only:
        run = common.prepare_run(args, accelerator, train, model, preprocessing)
        times = [epoch_of_batches(run)]
        started = time.time()
        kept = common.keep_in_memory(run, train, preprocessing, (28, 28))
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
    pixels, labels = common.eval_tensors(test, preprocessing, (28, 28))
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
