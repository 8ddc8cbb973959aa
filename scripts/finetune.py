"""Fine-tune (or train from scratch) a hubvit image classifier with Accelerate over `datasets`.

    accelerate launch scripts/finetune.py --output_dir OUT      # embedded MNIST digits, no network
    python scripts/finetune.py --help

The library code is `hubvit.scripts.training`; this file only runs it.
"""

import sys

from hubvit.scripts.training import main

if __name__ == "__main__":
    sys.exit(main())
