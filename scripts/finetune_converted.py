"""Fine-tune a converted transformers tower with the README's main command: does a converted folder train like hubvit's own?

    python scripts/finetune_converted.py --tower dinov3 --seeds 1 --json docs/analysis/finetune_converted_dinov3.json
    python scripts/finetune_converted.py --tower siglip --seeds 1 --json docs/analysis/finetune_converted_siglip.json

The tower (transformers' `DINOv3ViTModel` or `SiglipVisionModel`) is built at the main command's model size (28 px,
patch 7, width 96, 6 blocks, 4 heads, MLP 192) with transformers' own initialisation, saved with `save_pretrained`,
converted with `hubvit convert transformers`, and handed to the main command as `--model_name_or_path`: each run is
`accelerate launch scripts/finetune.py --output_dir DIR --seed S --model_name_or_path FOLDER` with the main command's
from-scratch recipe spelled out (`RECIPE`: a folder given by path otherwise gets the 5-epoch fine-tuning recipe
meant for pretrained weights), recorded as `scripts/main_command_seeds.py` records the main command itself
(accuracy, wall time, load), so the two compare. Offline: no weights are downloaded, so this is the tower's
architecture and transformers' initialisation trained on the digits as the main command trains its own model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.main_command_seeds import ROOT, environment, run_seed, summarise  # noqa: E402

SIZE = dict(
    image_size=28, patch_size=7, hidden_size=96, num_hidden_layers=6, num_attention_heads=4, intermediate_size=192
)
RECIPE = (  # the main command's embedded from-scratch defaults (hubvit/training/arguments.py DEFAULTS["embedded"])
    *("--learning_rate", "2e-3", "--num_train_epochs", "60", "--weight_decay", "0.05", "--warmup_ratio", "0.05"),
    *("--label_smoothing", "0.1", "--per_device_train_batch_size", "64", "--dataloader_num_workers", "1"),
)
TOWERS = {"dinov3": ("DINOv3ViTModel", dict(num_register_tokens=2)), "siglip": ("SiglipVisionModel", {})}


def converted_tower(tower: str, folder: Path) -> Path:
    """The tower at the main command's size, saved by transformers and converted by the CLI; the hubvit folder."""
    import torch
    import transformers

    architecture, fields = TOWERS[tower]
    model_class = getattr(transformers, architecture)
    torch.manual_seed(0)
    model_class(model_class.config_class(**SIZE, **fields)).save_pretrained(folder / "transformers")
    command = ["hubvit", "convert", "transformers", str(folder / "transformers"), str(folder / "hubvit")]
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return folder / "hubvit"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tower", choices=sorted(TOWERS), required=True)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--first_seed", type=int, default=0)
    parser.add_argument("--json", type=Path, required=True, help="where to write (or, with --merge, add to) runs")
    parser.add_argument("--merge", action="store_true", help="keep the runs already in --json, add these")
    options = parser.parse_args(argv)
    runs = json.loads(options.json.read_text())["runs"] if options.merge and options.json.is_file() else []
    with tempfile.TemporaryDirectory() as scratch:
        folder = converted_tower(options.tower, Path(scratch))
        for seed in range(options.first_seed, options.first_seed + options.seeds):
            run = run_seed(seed, Path(scratch) / f"seed{seed}", ("--model_name_or_path", str(folder), *RECIPE))
            print(f"seed {seed}: accuracy {run['eval_accuracy']:.4f}, {run['wall_time_s']:.0f} s", flush=True)
            runs = [r for r in runs if r["seed"] != seed] + [run]
    runs.sort(key=lambda r: r["seed"])
    architecture, fields = TOWERS[options.tower]
    report = {
        "command": f"python scripts/finetune_converted.py --tower {options.tower}",
        "recipe": " ".join(RECIPE),
        "tower": {"architecture": architecture, **SIZE, **fields},
        "environment": environment(),
        "summary": summarise(runs),
        "runs": runs,
    }
    options.json.parent.mkdir(parents=True, exist_ok=True)
    temporary = options.json.with_suffix(".tmp")
    temporary.write_text(json.dumps(report, indent=1) + "\n")
    temporary.replace(options.json)
    s = report["summary"]
    print(f"{s['seeds']} seeds: accuracy {s['mean_accuracy']:.4f} +- {s['std_accuracy']:.4f} (sd)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
