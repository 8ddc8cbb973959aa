"""Throughput of HubViT against timm's and transformers' ViT with the same architecture, in one process.

Every library builds the same network (widths, depth, heads, LayerNorm eps 1e-6, qkv bias, [CLS] token with a
position row, no dropout, SDPA attention) and runs on the same weights: HubViT's random weights are copied into the
other two, and the largest logit difference is printed as proof that the three compute the same function.

Timing is interleaved: after a warm-up, each round times every library once (in a rotating order). Throughput is
the median over rounds; a ratio is the median over rounds of that round's ratio, so a shared, noisy machine that
slows one round slows every library in it alike.

    python benchmarks/benchmark.py                      # CPU: ViT-S/16, ViT-B/16 inference, ViT-Ti/16 training
    python benchmarks/benchmark.py --device cuda        # bf16 autocast, batch 256, with MFU
"""

import argparse
import platform
import re
import statistics
import time

import torch
import torch.nn.functional as F

ARCHITECTURES = {
    "ti16": dict(name="ViT-Ti/16", hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768),
    "s16": dict(name="ViT-S/16", hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536),
    "b16": dict(name="ViT-B/16", hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}
IMAGE_SIZE, PATCH_SIZE, NUM_CLASSES = 224, 16, 1000
LIBRARIES = ("hubvit", "timm", "transformers")
CPU_CASES = ("s16-infer", "b16-infer", "ti16-train")
CUDA_CASES = ("s16-infer", "b16-infer", "b16-train")

# Dense (not sparse) bf16 tensor-core peak in TFLOP/s from the vendor's data sheets, matched as a substring of
# torch.cuda.get_device_name(); first match wins, so longer names come first. Anything else: --peak-tflops.
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
)


def forward_flops(arch, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, num_classes=NUM_CLASSES):
    """Multiply-adds x 2 of one image's forward pass: patch embedding, qkv/proj/MLP matmuls, QK^T and AV, head.

    ViT-B/16 at 224 gives 35.1 GFLOP (the usual 35.2 figure rounds the same count).
    """
    d, m, depth = arch["hidden_size"], arch["intermediate_size"], arch["num_hidden_layers"]
    patches = (image_size // patch_size) ** 2
    tokens = patches + 1
    block = tokens * (4 * d * d + 2 * d * m) + 2 * tokens * tokens * d
    return 2 * (patches * 3 * patch_size * patch_size * d + depth * block + d * num_classes)


def config_fields(arch):
    """The fields HubViTConfig and transformers' ViTConfig share, for `arch` with the benchmark's head."""
    return dict(
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        hidden_size=arch["hidden_size"],
        num_hidden_layers=arch["num_hidden_layers"],
        num_attention_heads=arch["num_attention_heads"],
        intermediate_size=arch["intermediate_size"],
        layer_norm_eps=1e-6,
        qkv_bias=True,
        num_labels=NUM_CLASSES,
        attn_implementation="sdpa",
    )


def build_hubvit(arch):
    from hubvit import HubViTConfig, HubViTForImageClassification

    config = HubViTConfig(**config_fields(arch))
    model = HubViTForImageClassification(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if re.search(r"norm\d?\.weight$", name):
                tensor.copy_(1.0 + 0.1 * torch.randn(tensor.shape, generator=generator))
            else:
                tensor.copy_(0.02 * torch.randn(tensor.shape, generator=generator))
    return model


def build_timm(arch):
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        embed_dim=arch["hidden_size"],
        depth=arch["num_hidden_layers"],
        num_heads=arch["num_attention_heads"],
        mlp_ratio=arch["intermediate_size"] / arch["hidden_size"],
        qkv_bias=True,
        class_token=True,
        global_pool="token",
        num_classes=NUM_CLASSES,
    )


def build_transformers(arch):
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        **config_fields(arch), hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    return ViTForImageClassification(config)


def hubvit_to_timm(state):
    rules = (
        (r"^hubvit\.embeddings\.patch_embedding\.", "patch_embed.proj."),
        (r"^hubvit\.embeddings\.class_token$", "cls_token"),
        (r"^hubvit\.embeddings\.position_embedding$", "pos_embed"),
        (r"^hubvit\.encoder\.layers\.(\d+)\.attention\.", r"blocks.\1.attn."),
        (r"^hubvit\.encoder\.layers\.(\d+)\.", r"blocks.\1."),
        (r"^hubvit\.norm\.", "norm."),
        (r"^classifier\.", "head."),
    )
    return rename(state, rules)


def rename(state, rules, out=None):
    """`state` with each name rewritten by the first (pattern, target) rule that matches it."""
    out = {} if out is None else out
    for name, tensor in state.items():
        for pattern, target in rules:
            if re.match(pattern, name):
                out[re.sub(pattern, target, name)] = tensor
                break
    return out


def hubvit_to_transformers(state):
    rules = (
        (r"^hubvit\.embeddings\.patch_embedding\.", "vit.embeddings.patch_embeddings.projection."),
        (r"^hubvit\.embeddings\.class_token$", "vit.embeddings.cls_token"),
        (r"^hubvit\.embeddings\.position_embedding$", "vit.embeddings.position_embeddings"),
        (r"^hubvit\.encoder\.layers\.(\d+)\.attention\.proj\.", r"vit.layers.\1.attention.o_proj."),
        (r"^hubvit\.encoder\.layers\.(\d+)\.norm1\.", r"vit.layers.\1.layernorm_before."),
        (r"^hubvit\.encoder\.layers\.(\d+)\.norm2\.", r"vit.layers.\1.layernorm_after."),
        (r"^hubvit\.encoder\.layers\.(\d+)\.mlp\.", r"vit.layers.\1.mlp."),
        (r"^hubvit\.norm\.", "vit.layernorm."),
        (r"^classifier\.", "classifier."),
    )
    out, rest = {}, {}
    for name, tensor in state.items():
        qkv = re.match(r"^hubvit\.encoder\.layers\.(\d+)\.attention\.qkv\.(weight|bias)$", name)
        if qkv:
            for part, chunk in zip(("q", "k", "v"), tensor.chunk(3, dim=0)):
                out[f"vit.layers.{qkv[1]}.attention.{part}_proj.{qkv[2]}"] = chunk
        else:
            rest[name] = tensor
    return rename(rest, rules, out)


def build_models(arch, libraries):
    """The three models on HubViT's weights (loaded strictly, so a missed tensor fails loudly)."""
    hubvit = build_hubvit(arch)
    state = hubvit.state_dict()
    models = {}
    for library in libraries:
        if library == "hubvit":
            models[library] = hubvit
        elif library == "timm":
            models[library] = build_timm(arch)
            models[library].load_state_dict(hubvit_to_timm(state), strict=True)
        elif library == "transformers":
            models[library] = build_transformers(arch)
            models[library].load_state_dict(hubvit_to_transformers(state), strict=True)
    return models


def attention_backends(models):
    """What each model will call for attention, read from the models themselves."""
    backends = {}
    for name, model in models.items():
        if name == "timm":
            backends[name] = "F.sdpa" if model.blocks[0].attn.fused_attn else "eager"
        else:
            backends[name] = model.config._attn_implementation
    return backends


def logits_of(library, model, images):
    return model(images) if library == "timm" else model(pixel_values=images).logits


class Case:
    """One benchmark case: a callable per library that runs `iterations` steps on a fixed batch."""

    def __init__(self, key, args):
        arch_key, mode = key.split("-")
        self.arch = ARCHITECTURES[arch_key]
        self.mode = mode
        self.title = f"{self.arch['name']} {'inference' if mode == 'infer' else 'training step'}"
        self.device = torch.device(args.device)
        self.autocast = args.device == "cuda" and args.dtype == "bfloat16"
        self.dtype = torch.float32 if self.autocast else getattr(torch, args.dtype)
        self.batch_size = args.batch_size or (256 if args.device == "cuda" else (8 if mode == "infer" else 16))
        self.models = {
            name: model.to(self.device, self.dtype) for name, model in build_models(self.arch, args.libraries).items()
        }
        generator = torch.Generator().manual_seed(1)
        self.images = torch.randn(self.batch_size, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
        self.images = self.images.to(self.device, self.dtype)
        self.labels = torch.randint(0, NUM_CLASSES, (self.batch_size,), generator=generator).to(self.device)
        self.optimizers = {}
        for name, model in self.models.items():
            model.train(mode == "train")
            if mode == "train":
                self.optimizers[name] = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def parity(self):
        """Largest |logits - hubvit logits| per library, in eval mode on this batch."""
        with torch.inference_mode(), self.autocast_context():
            outputs = {}
            for name, model in self.models.items():
                was_training = model.training
                model.eval()
                outputs[name] = logits_of(name, model, self.images).float()
                model.train(was_training)
        reference = outputs.get("hubvit")
        if reference is None:
            return {}
        return {name: (out - reference).abs().max().item() for name, out in outputs.items() if name != "hubvit"}

    def autocast_context(self):
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast)

    def step(self, name):
        model = self.models[name]
        if self.mode == "infer":
            with torch.inference_mode(), self.autocast_context():
                logits_of(name, model, self.images)
            return
        optimizer = self.optimizers[name]
        optimizer.zero_grad(set_to_none=True)
        with self.autocast_context():
            loss = F.cross_entropy(logits_of(name, model, self.images).float(), self.labels)
        loss.backward()
        optimizer.step()

    def synchronize(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def time(self, name, iterations, clock=time.perf_counter):
        self.synchronize()
        start = clock()
        for _ in range(iterations):
            self.step(name)
        self.synchronize()
        return clock() - start

    def flops_per_image(self):
        return forward_flops(self.arch) * (3 if self.mode == "train" else 1)


def run_case(case, args):
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    names = list(case.models)
    for name in names:
        for _ in range(args.warmup):
            case.step(name)
    iterations = args.iterations
    if iterations is None:
        slowest = max(case.time(name, 1, clock) for name in names)
        iterations = max(1, round(args.seconds / slowest))
    throughput = {name: [] for name in names}
    for round_index in range(args.rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            elapsed = case.time(name, iterations, clock)
            throughput[name].append(case.batch_size * iterations / elapsed)
    medians = {name: statistics.median(values) for name, values in throughput.items()}
    ratios = {}
    if "hubvit" in throughput:
        for name in names:
            if name != "hubvit":
                paired = [mine / theirs for mine, theirs in zip(throughput["hubvit"], throughput[name])]
                ratios[name] = statistics.median(paired)
    return medians, ratios, iterations


def peak_tflops(args):
    if args.peak_tflops:
        return args.peak_tflops
    if args.device != "cuda":
        return None
    device_name = torch.cuda.get_device_name()
    for key, value in PEAK_BF16_TFLOPS:
        if key in device_name:
            return value
    return None


def describe_environment(args):
    import timm
    import transformers

    if args.device == "cuda":
        where = torch.cuda.get_device_name()
    else:
        where = f"{platform.processor() or platform.machine()}, torch threads={torch.get_num_threads()}"
    return (
        f"torch {torch.__version__}, timm {timm.__version__}, transformers {transformers.__version__}; "
        f"device {args.device} ({where}); dtype {'bf16 autocast' if args.device == 'cuda' and args.dtype == 'bfloat16' else args.dtype}"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="float32 (CPU default); bfloat16 on CUDA (default) means autocast over float32 weights",
    )
    parser.add_argument("--batch-size", type=int, default=None, help="CPU: 8 inference / 16 training; CUDA: 256")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=None, help="steps per timing (default: about --seconds)")
    parser.add_argument("--seconds", type=float, default=1.0, help="target length of one timing")
    parser.add_argument(
        "--models",
        default=None,
        help=f"comma-separated cases <arch>-<infer|train>, arch in {list(ARCHITECTURES)} "
        f"(CPU default {','.join(CPU_CASES)}; CUDA default {','.join(CUDA_CASES)})",
    )
    parser.add_argument("--libraries", default=",".join(LIBRARIES))
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or this process's CPU time (with --threads 1: the work done, robust to a loaded machine)",
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="accelerator peak for MFU (bf16 dense)")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.libraries = [name.strip() for name in args.libraries.split(",") if name.strip()]
    cases = args.models.split(",") if args.models else (CUDA_CASES if args.device == "cuda" else CPU_CASES)
    for key in cases:
        arch, _, mode = key.partition("-")
        if arch not in ARCHITECTURES or mode not in ("infer", "train"):
            parser.error(f"--models: unknown case {key!r}; expected <arch>-<infer|train> with arch in {list(ARCHITECTURES)}")
    for name in args.libraries:
        if name not in LIBRARIES:
            parser.error(f"--libraries: unknown library {name!r}; expected some of {list(LIBRARIES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    print(describe_environment(args))
    peak = peak_tflops(args)
    header = ["case", "batch"] + [f"{name} img/s" for name in args.libraries]
    header += [f"hubvit/{name}" for name in args.libraries if name != "hubvit"]
    if peak:
        header += ["hubvit TFLOP/s", "hubvit MFU"]
    rows = []
    for key in cases:
        case = Case(key, args)
        differences = case.parity()
        throughput, ratios, iterations = run_case(case, args)
        row = [case.title, str(case.batch_size)] + [f"{throughput[name]:.1f}" for name in args.libraries]
        if "hubvit" in throughput:
            row += [f"{ratios[name]:.2f}x" for name in args.libraries if name != "hubvit"]
            if peak:
                achieved = throughput["hubvit"] * case.flops_per_image() / 1e12
                row += [f"{achieved:.1f}", f"{100 * achieved / peak:.1f}%"]
        rows.append(row)
        parity = ", ".join(f"{name} {value:.1e}" for name, value in differences.items())
        backends = ", ".join(f"{name} {value}" for name, value in attention_backends(case.models).items())
        print(
            f"{case.title}: {args.rounds} rounds x {iterations} steps ({args.clock} clock); "
            f"max |logits - hubvit|: {parity or 'n/a'}; attention: {backends}"
        )
        del case
        if args.device == "cuda":
            torch.cuda.empty_cache()
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(" --- " for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if peak:
        print(f"\nMFU against {peak:.0f} TFLOP/s bf16 dense; ViT-B/16 forward = {forward_flops(ARCHITECTURES['b16']) / 1e9:.1f} GFLOP per image, training step = 3x forward.")


if __name__ == "__main__":
    main()
