"""What `--gradient_checkpointing` buys and costs: peak resident memory and time of a training step, with and without.

Each setting runs in its own fresh process (peak resident memory is per process: it counts the weights, gradients
and torch itself as well as the activations), alternating, `--repeats` times: one warm-up step, then `--steps` timed
steps of SGD on random images at the model's size, each timed by the wall clock and by the process's CPU time.
Checkpointing recomputes the forward pass of every block, about a third of a step's work: the CPU time shows that
cost; the wall clock can show less where the smaller working set runs faster.

    python benchmarks/activation_checkpointing.py [--model s16] [--batch_size 32] [--repeats 2] [--json PATH]
"""

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch

from hubvit.presets import SIZES

NAMES = {"ti16": "ViT-Ti/16", "s16": "ViT-S/16", "b16": "ViT-B/16"}
MODELS = {f"{letter}16": SIZES[letter].fields() for letter in ("ti", "s", "b")}


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(model_key, batch_size, steps, checkpointing):
    """Peak resident MiB of this process and the median wall and CPU seconds of `steps` steps after one warm-up."""
    from hubvit import HubViTConfig, HubViTForImageClassification
    from hubvit.training.model import enable_activation_checkpointing

    torch.manual_seed(0)
    config = HubViTConfig(**MODELS[model_key], num_labels=10)
    model = HubViTForImageClassification(config).train()
    if checkpointing:
        enable_activation_checkpointing(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    pixels = torch.randn(batch_size, 3, *config.image_size_2d)
    labels = torch.arange(batch_size) % 10

    def step():
        optimizer.zero_grad(set_to_none=False)
        model(pixel_values=pixels, labels=labels).loss.backward()
        optimizer.step()

    step()
    wall, cpu = [], []
    for _ in range(steps):
        started, used = time.perf_counter(), cpu_seconds()
        step()
        wall.append(time.perf_counter() - started)
        cpu.append(cpu_seconds() - used)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"peak_mib": peak, "step_s": statistics.median(wall), "step_cpu_s": statistics.median(cpu)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="s16")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(measure(args.model, args.batch_size, args.steps, args.child == "on")))
        return
    from hubvit.cpu import cpu_isa

    runs = {"off": [], "on": []}
    for _ in range(args.repeats):
        for setting in runs:
            command = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--child", setting]
            child = subprocess.run(command, capture_output=True, text=True)
            if child.returncode:
                sys.exit(f"the {setting} process failed:\n{child.stderr[-3000:]}")
            runs[setting].append(json.loads(child.stdout.strip().splitlines()[-1]))
    summary = {
        setting: {key: statistics.median(run[key] for run in results) for key in ("peak_mib", "step_s", "step_cpu_s")}
        for setting, results in runs.items()
    }
    print(
        f"{NAMES[args.model]} training step, batch {args.batch_size}, {args.threads} threads, CPU ISA {cpu_isa()} "
        f"({platform.processor() or platform.machine()}), torch {torch.__version__}; medians of {args.steps} steps in "
        f"each of {args.repeats} processes per setting"
    )
    print("| activation checkpointing | peak resident memory | step, wall clock | step, CPU time |")
    print("| --- | --- | --- | --- |")
    for setting, figures in summary.items():
        print(
            f"| {setting} | {figures['peak_mib'] / 1024:.2f} GiB | {figures['step_s']:.2f} s | "
            f"{figures['step_cpu_s']:.2f} s |"
        )
    off, on = summary["off"], summary["on"]
    print(
        f"memory x{on['peak_mib'] / off['peak_mib']:.2f}, wall clock x{on['step_s'] / off['step_s']:.2f}, "
        f"CPU time x{on['step_cpu_s'] / off['step_cpu_s']:.2f}"
    )
    if args.json:
        record = dict(vars(args), isa=cpu_isa(), torch=torch.__version__, runs=runs, summary=summary)
        record.pop("child")
        with open(args.json, "w") as handle:
            json.dump(record, handle, indent=2)


if __name__ == "__main__":
    main()
