"""Write the embedded digits (or an imagefolder) as N train shards plus validation shards, for `--streaming`.

python scripts/write_shards.py --output_dir shards --num_shards 10
python scripts/finetune.py --streaming --dataset_name shards --output_dir out
"""

import argparse
import sys

from hubvit.errors import HubViTError
from hubvit.training.shards import FORMATS, embedded_digits, imagefolder, write_dataset_shards


def main(argv=None):
    parser = argparse.ArgumentParser(prog="write_shards.py", description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument(
        "--num_shards", type=int, required=True, help="training shards (a multiple of the process count)"
    )
    parser.add_argument("--validation_shards", type=int, default=1)
    parser.add_argument("--validation_fraction", type=float, default=0.15)
    parser.add_argument("--train_dir", help="an imagefolder (one subfolder per class); default: the embedded digits")
    parser.add_argument("--format", choices=FORMATS, default="parquet")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        dataset = imagefolder(args.train_dir) if args.train_dir else embedded_digits()
        written = write_dataset_shards(
            dataset,
            args.output_dir,
            args.num_shards,
            args.format,
            args.validation_fraction,
            args.validation_shards,
            args.seed,
        )
    except HubViTError as error:
        print(f"write_shards.py: error: {error}", file=sys.stderr)
        return 2
    for split, paths in written.items():
        print(f"{split}: {len(paths)} shards in {args.output_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
