"""Fine-tune (or train from scratch) a hubvit image classifier with Accelerate over `datasets`.

    accelerate launch scripts/finetune.py --output_dir OUT      # embedded MNIST digits, no network
    python scripts/finetune.py --help                            # the same options as `hubvit train --help`

The entry itself is `hubvit.cli.finetune` (what `hubvit train` runs); this file lets Accelerate launch it by path.
"""

import sys

from hubvit.cli.finetune import main

if __name__ == "__main__":
    sys.exit(main())
