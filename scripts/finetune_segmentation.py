"""Fine-tune (or train from scratch) a hubvit semantic segmentation model with Accelerate over `datasets`.

    accelerate launch scripts/finetune_segmentation.py --output_dir OUT    # embedded MNIST digit canvases, no network
    python scripts/finetune_segmentation.py --help

The entry itself is `hubvit.cli.finetune_segmentation` (what `hubvit train-segmentation` runs); this file lets
Accelerate launch it by path.
"""

import sys

from hubvit.cli.finetune_segmentation import main

if __name__ == "__main__":
    sys.exit(main())
