"""The two kernels `hubvit.optimize_for_cpu` chooses between: oneDNN against `nn.Linear` (BLAS sgemm, MKL).

Times the four projections of a ViT-S/16, ViT-B/16 and ViT-Ti/16 encoder block (qkv, attention output, MLP in and
out) at the benchmark's token counts, forward under inference mode and forward + backward, on the same weights and
inputs: `nn.Linear` against a `FastestLinear` whose chooser always answers oneDNN. Interleaved rounds, median;
prints GFLOP/s of each, their ratio, and the kernel the first-use probe of `optimize_for_cpu` picks for the forward
product on this machine.

    python benchmarks/projections.py --threads 1 --clock cpu
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from hubvit.cpu import CHOOSER, FastestLinear, KernelChooser

TOKENS = 197
SHAPES = (  # (name, batch, in_features, out_features)
    ("S/16 qkv", 8, 384, 1152),
    ("S/16 proj", 8, 384, 384),
    ("S/16 fc1", 8, 384, 1536),
    ("S/16 fc2", 8, 1536, 384),
    ("B/16 qkv", 8, 768, 2304),
    ("B/16 proj", 8, 768, 768),
    ("B/16 fc1", 8, 768, 3072),
    ("B/16 fc2", 8, 3072, 768),
    ("Ti/16 qkv", 16, 192, 576),
    ("Ti/16 proj", 16, 192, 192),
    ("Ti/16 fc1", 16, 192, 768),
    ("Ti/16 fc2", 16, 768, 192),
)


def seconds(step, iterations, clock):
    start = clock()
    for _ in range(iterations):
        step()
    return (clock() - start) / iterations


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall time or this process's CPU time")
    args = parser.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, {args.clock} clock")
    print("| projection | tokens | mode | nn.Linear (MKL) GFLOP/s | oneDNN GFLOP/s | ratio | probe picks (forward) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    always_onednn = KernelChooser(lambda kernel, *shape: 1.0 if kernel == "onednn" else 2.0, rounds=1)
    for name, batch, fan_in, fan_out in SHAPES:
        layer = FastestLinear(fan_in, fan_out)
        layer.chooser = always_onednn
        x = torch.randn(batch, TOKENS, fan_in, requires_grad=True)
        grad = torch.randn(batch, TOKENS, fan_out)
        flops = 2 * batch * TOKENS * fan_in * fan_out

        def infer(project):
            def step():
                with torch.inference_mode():
                    project(x)

            return step

        def train(project):
            def step():
                project(x).backward(grad)

            return step

        reference = lambda t: F.linear(t, layer.weight, layer.bias)  # noqa: E731
        for mode, make, work in (("forward", infer, flops), ("fwd+bwd", train, 3 * flops)):
            steps = {"linear": make(reference), "hubvit": make(layer)}
            for step in steps.values():
                step()
            times = {key: [] for key in steps}
            for _ in range(args.rounds):
                for key, step in steps.items():
                    times[key].append(seconds(step, args.iterations, clock))
            ratio = statistics.median(a / b for a, b in zip(times["linear"], times["hubvit"]))
            rate = {key: work / statistics.median(values) / 1e9 for key, values in times.items()}
            pick = CHOOSER.choose(batch * TOKENS, fan_in, fan_out) if mode == "forward" else ""
            print(
                f"| {name} | {batch}x{TOKENS} | {mode} | {rate['linear']:.0f} | {rate['hubvit']:.0f} | {ratio:.2f}x "
                f"| {pick} |"
            )


if __name__ == "__main__":
    main()
