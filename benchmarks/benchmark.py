"""Throughput of HubViT's routes against timm's and transformers' ViT with the same architecture, in one process.

Every library builds the same network (widths, depth, heads, LayerNorm eps 1e-6, qkv bias, [CLS] token with a
position row, no dropout, SDPA attention) and runs on the same weights: HubViT's random weights are copied into the
other two, and every route's largest logit difference from HubViT's default is printed as proof that all compute the
same function. Routes (CPU): each library eager; `hubvit.optimize_for_cpu`; each library under `torch.compile`
(inductor) and, for inference, `torch.compile` with inductor `freezing`; the ONNX exports of hubvit (`hubvit export
onnx`'s dynamic graph) and timm (static) in onnxruntime, and in OpenVINO with hubvit's graph reshaped to the batch's
shape before compiling, as docs/conversion.md advises for a fixed input size (timm's is static already), and as
exported (`openvino-dynamic`).

Timing is interleaved: after a warm-up, each round times every route once, in an order shuffled per round (seeded)
so that no route always follows the same one, each after a short pause that lets the previous route's threads go
idle (`SETTLE_SECONDS`). Throughput is the
median over rounds; a ratio is the median over rounds of that round's ratio, so a shared, noisy machine that slows
one round slows every route in it alike. For ViT-B/16 inference the script also measures this CPU's float32 GEMM
peak on the encoder's shapes (the faster of MKL and oneDNN per shape) and prints the fraction hubvit reaches.

    python benchmarks/benchmark.py                      # CPU: ViT-S/16, ViT-B/16 inference, ViT-Ti/16 training
    python benchmarks/benchmark.py --threads 1 --clock cpu   # the work done by one thread, robust to a loaded machine
    python benchmarks/benchmark.py --quick              # a 2-layer model, every route, one round (a smoke test)
    python benchmarks/benchmark.py --device cuda        # bf16 autocast, batch 256, with MFU
"""

import argparse
import importlib.util
import platform
import random
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from hubvit.presets import SIZES

ARCHITECTURES = {
    **{
        f"{letter}16": dict(name=f"ViT-{letter.capitalize()}/16", **SIZES[letter].fields())
        for letter in ("ti", "s", "b")
    },
    "tiny": dict(
        name="ViT-2L/8 (tiny)",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
    ),
}
IMAGE_SIZE, PATCH_SIZE, NUM_CLASSES = 224, 16, 1000
LIBRARIES = ("hubvit", "timm", "transformers")
CPU_CASES = ("s16-infer", "b16-infer", "ti16-train")
CUDA_CASES = ("s16-infer", "b16-infer", "b16-train")
QUICK_CASES = ("tiny-infer", "tiny-train")

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


def forward_flops(arch):
    """FLOPs of one image's forward pass, as `hubvit info` counts them on the model itself (FlopCounterMode on the
    meta device): patch embedding, qkv/proj/MLP matmuls, QK^T and AV, head. ViT-B/16 at 224 gives 35.1 GFLOP (the
    usual 35.2 figure rounds the same count)."""
    from hubvit import HubViTConfig
    from hubvit.analysis import info

    fields = {key: value for key, value in config_fields(arch).items() if key != "attn_implementation"}
    return info.summary(HubViTConfig(**fields))["macs_per_image"]["forward_flops"]


def config_fields(arch):
    """The fields HubViTConfig and transformers' ViTConfig share, for `arch` with the benchmark's head."""
    return dict(
        image_size=arch.get("image_size", IMAGE_SIZE),
        patch_size=arch.get("patch_size", PATCH_SIZE),
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
        img_size=arch.get("image_size", IMAGE_SIZE),
        patch_size=arch.get("patch_size", PATCH_SIZE),
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
    """What each eager model will call for attention, read from the models themselves."""
    backends = {}
    for name, model in models.items():
        if name == "timm":
            backends[name] = "F.sdpa" if model.blocks[0].attn.fused_attn else "eager"
        else:
            backends[name] = model.config._attn_implementation
    return backends


def logits_of(library, model, images):
    return model(images) if library == "timm" else model(pixel_values=images).logits


CPU_ROUTES = (
    "eager",
    "cpu",
    "compile",
    "freezing",
    "onnx",
    "onnx-fused",
    "openvino",
    "openvino-dynamic",
    "openvino-default",
    "int8",
    "onnx-int8",
    "bf16",
)
CUDA_ROUTES = ("eager", "flash", "compile")
ROUTE_KINDS = tuple(dict.fromkeys(CPU_ROUTES + CUDA_ROUTES))
SUFFIXES = {
    "eager": "",
    "cpu": " + optimize_for_cpu",
    "compile": " compile",
    "freezing": " compile+freezing",
    "onnx": " onnxruntime",
    "onnx-fused": " onnxruntime fused",
    "openvino": " openvino f32",
    "openvino-dynamic": " openvino f32 dynamic shape",
    "openvino-default": " openvino default precision",
    "int8": " + optimize_for_cpu int8",
    "onnx-int8": " onnxruntime int8",
    "bf16": " bf16",
    "flash": " flash attention",
}
# The libraries an OpenVINO route is measured for: hubvit's graph compiled as exported (dynamic shape) is a row of
# its own; timm's export is static already.
OPENVINO_ROUTES = {
    "openvino": ("hubvit", "timm"),
    "openvino-dynamic": ("hubvit",),
    "openvino-default": ("hubvit", "timm"),
}
# Routes that do not compute in float32 (or in the case's dtype): left out of the fp32 "best route" comparisons.
REDUCED_PRECISION = ("openvino-default", "int8", "onnx-int8", "bf16")


class Route:
    """One way to run one library's model: `logits(images)` in eval mode, and the module that a step trains."""

    def __init__(self, library, kind, module=None, session=None, compiled=None):
        self.library, self.kind, self.module, self.session, self.compiled = library, kind, module, session, compiled
        self.name = library + SUFFIXES[kind]
        self.reduced_precision = kind in REDUCED_PRECISION

    def logits(self, images):
        if self.session is not None:
            (output,) = self.session.run(None, {self.session.get_inputs()[0].name: images.numpy()})
            return torch.from_numpy(output)
        if self.compiled is not None:
            return torch.from_numpy(self.compiled(images.numpy())[0])
        if self.kind == "bf16" and self.library != "hubvit":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return logits_of(self.library, self.module, images).float()
        if self.kind == "flash":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return logits_of(self.library, self.module, images)
        return logits_of(self.library, self.module, images)


def onnx_file(library, model, images, folder, opset):
    """The model exported to ONNX once per case (hubvit: the dynamic graph `hubvit export onnx --opset OPSET` writes;
    timm: a static one at torch.onnx's default opset)."""
    path = folder / f"{library}.onnx"
    if path.exists():
        return path
    with torch.no_grad():
        if library == "hubvit":
            from hubvit.conversion.export_onnx import export_graph

            export_graph(model, path, opset)
        else:
            torch.onnx.export(model, (images,), dynamo=True, input_names=["pixel_values"], verbose=False).save(
                str(path)
            )
    return path


def onnx_session(path, threads):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def fused_onnx_file(path, config):
    """`path` with onnxruntime's fused attention and GELU, as `hubvit export onnx --onnxruntime_fusion` writes it."""
    import onnx

    from hubvit.conversion.fuse_onnx import fuse_for_onnxruntime

    target = path.with_name(path.stem + ".fused.onnx")
    if not target.exists():
        graph = onnx.load(str(path))
        fuse_for_onnxruntime(graph, config)
        onnx.save(graph, str(target))
    return target


def int8_onnx_file(path, config):
    """`path` fused and with its encoder projections int8, as `hubvit export onnx --int8` writes it."""
    from hubvit.conversion.quantize_onnx import quantize_graph

    fused = fused_onnx_file(path, config)
    target = path.with_name(path.stem + ".int8.onnx")
    if not target.exists():
        quantize_graph(fused, target)
    return target


def openvino_model(path, threads, precision, shape=None):
    """OpenVINO's CPU plugin compiling the ONNX file, with its input fixed to `shape` unless None; precision "f32"
    pins float32, None keeps the plugin's default (bf16 on CPUs with native bf16, f32 elsewhere)."""
    import openvino

    core = openvino.Core()
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if precision:
        config["INFERENCE_PRECISION_HINT"] = precision
    model = core.read_model(str(path))
    if shape is not None:
        model.reshape({model.input(0).get_any_name(): list(shape)})
    compiled = core.compile_model(model, "CPU", config)
    return compiled, str(compiled.get_property("INFERENCE_PRECISION_HINT"))


class Case:
    """One benchmark case: every route of every library on one fixed batch and the same weights."""

    def __init__(self, key, args, folder):
        import copy

        arch_key, mode = key.split("-")
        self.arch = ARCHITECTURES[arch_key]
        self.mode = mode
        self.title = f"{self.arch['name']} {'inference' if mode == 'infer' else 'training step'}"
        self.device = torch.device(args.device)
        self.autocast = args.device == "cuda" and args.dtype == "bfloat16"
        self.dtype = torch.float32 if self.autocast else getattr(torch, args.dtype)
        self.batch_size = args.batch_size or (256 if args.device == "cuda" else (8 if mode == "infer" else 16))
        models = {
            name: model.to(self.device, self.dtype) for name, model in build_models(self.arch, args.libraries).items()
        }
        for model in models.values():
            model.train(mode == "train")
        self.backends = attention_backends(models)
        size = self.arch.get("image_size", IMAGE_SIZE)
        generator = torch.Generator().manual_seed(1)
        self.images = torch.randn(self.batch_size, 3, size, size, generator=generator).to(self.device, self.dtype)
        self.labels = torch.randint(0, NUM_CLASSES, (self.batch_size,), generator=generator).to(self.device)
        cpu_float32 = args.device == "cpu" and self.dtype == torch.float32
        self.routes = []
        self.notes = []
        cpu_inference = cpu_float32 and mode == "infer"
        for kind in args.routes:
            for library, model in models.items():
                if kind == "eager":
                    self.routes.append(Route(library, kind, model))
                elif kind == "cpu" and library == "hubvit" and cpu_float32:
                    from hubvit import optimize_for_cpu

                    self.routes.append(Route(library, kind, optimize_for_cpu(copy.deepcopy(model))))
                elif kind == "compile" or (kind == "freezing" and mode == "infer" and args.device == "cpu"):
                    options = {"freezing": True} if kind == "freezing" else None
                    self.routes.append(Route(library, kind, torch.compile(copy.deepcopy(model), options=options)))
                elif kind == "flash" and args.device == "cuda":
                    self.routes.append(Route(library, kind, copy.deepcopy(model)))
                elif kind == "onnx" and library in ("hubvit", "timm") and cpu_inference:
                    path = onnx_file(library, model.eval(), self.images, folder, args.opset)
                    self.routes.append(Route(library, kind, session=onnx_session(path, args.threads)))
                elif kind in OPENVINO_ROUTES and library in OPENVINO_ROUTES[kind] and cpu_inference:
                    if importlib.util.find_spec("openvino") is None:
                        note = "OpenVINO routes skipped: openvino is not installed (pip install 'hubvit[benchmark]')"
                        self.notes += [] if note in self.notes else [note]
                        continue
                    path = onnx_file(library, model.eval(), self.images, folder, args.opset)
                    shape = None if kind == "openvino-dynamic" else self.images.shape
                    precision = None if kind == "openvino-default" else "f32"
                    compiled, precision = openvino_model(path, args.threads, precision, shape)
                    if kind == "openvino-default":
                        self.notes.append(f"OpenVINO's default inference precision here: {precision}")
                    self.routes.append(Route(library, kind, compiled=compiled))
                elif kind == "int8" and library == "hubvit" and cpu_inference:
                    from hubvit import optimize_for_cpu

                    self.routes.append(Route(library, kind, optimize_for_cpu(copy.deepcopy(model), precision="int8")))
                elif kind == "bf16" and cpu_inference:
                    from hubvit.cpu import cpu_isa, has_native_bf16, optimize_for_cpu

                    if not has_native_bf16():
                        note = f"bf16 routes skipped: this CPU ({cpu_isa()}) has no native bfloat16"
                        self.notes += [] if note in self.notes else [note]
                        continue
                    bf16 = copy.deepcopy(model).eval()
                    self.routes.append(
                        Route(library, kind, optimize_for_cpu(bf16, precision="bf16") if library == "hubvit" else bf16)
                    )
                elif kind == "onnx-fused" and library == "hubvit" and cpu_inference:
                    path = fused_onnx_file(
                        onnx_file(library, model.eval(), self.images, folder, args.opset), model.config
                    )
                    self.routes.append(Route(library, kind, session=onnx_session(path, args.threads)))
                elif kind == "onnx-int8" and library == "hubvit" and cpu_inference:
                    path = int8_onnx_file(
                        onnx_file(library, model.eval(), self.images, folder, args.opset), model.config
                    )
                    self.routes.append(Route(library, kind, session=onnx_session(path, args.threads)))
        self.optimizers = {}
        if mode == "train":
            for route in self.routes:
                self.optimizers[route.name] = torch.optim.AdamW(route.module.parameters(), lr=1e-5)

    def autocast_context(self):
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast)

    def parity(self):
        """Largest |logits - hubvit default logits| per route, in eval mode on this batch."""
        outputs = {}
        with torch.inference_mode(self.mode == "infer"), torch.no_grad(), self.autocast_context():
            for route in self.routes:
                module = route.module
                was_training = module is not None and module.training
                if module is not None:
                    module.eval()
                outputs[route.name] = route.logits(self.images).float()
                if module is not None:
                    module.train(was_training)
        reference = outputs.get("hubvit")
        if reference is None:
            return {}
        return {name: (out - reference).abs().max().item() for name, out in outputs.items() if name != "hubvit"}

    def step(self, route):
        if self.mode == "infer":
            with torch.inference_mode(), self.autocast_context():
                route.logits(self.images)
            return
        optimizer = self.optimizers[route.name]
        optimizer.zero_grad(set_to_none=True)
        with self.autocast_context():
            loss = F.cross_entropy(route.logits(self.images).float(), self.labels)
        loss.backward()
        optimizer.step()

    def synchronize(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def time(self, route, iterations, clock=time.perf_counter):
        self.synchronize()
        start = clock()
        for _ in range(iterations):
            self.step(route)
        self.synchronize()
        return clock() - start

    def flops_per_image(self):
        return forward_flops(self.arch) * (3 if self.mode == "train" else 1)


# Seconds of idle before each timed route: onnxruntime's intra-op threads spin after a run by default, and on two
# cores they took about 10% from whichever route came next (ViT-S/16 bf16 after onnxruntime: 79.9 img/s with no
# pause, 88.4 with 0.3 s); with a rotating order a route had the same predecessor in most rounds, so the loss landed
# on the same routes in every run.
SETTLE_SECONDS = 0.2


def run_case(case, args):
    """Per-route throughput (images/s) of every round, interleaved in an order shuffled per round (seeded by the
    round), each timing after a pause that lets the previous route's threads go idle."""
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    routes = case.routes
    for route in routes:
        for _ in range(args.warmup):
            case.step(route)
    iterations = args.iterations
    if iterations is None:
        slowest = max(case.time(route, 1, clock) for route in routes)
        iterations = max(1, round(args.seconds / slowest))
    throughput = {route.name: [] for route in routes}
    for round_index in range(args.rounds):
        for route in random.Random(round_index).sample(routes, len(routes)):
            time.sleep(0.0 if args.quick else SETTLE_SECONDS)
            elapsed = case.time(route, iterations, clock)
            throughput[route.name].append(case.batch_size * iterations / elapsed)
    return throughput, iterations


def paired_ratio(mine, theirs):
    return statistics.median(a / b for a, b in zip(mine, theirs))


def best_per_round(throughput, names):
    return [max(values) for values in zip(*(throughput[name] for name in names))]


def gemm_peak(arch, batch_size, threads, clock, flops, repeats=5):
    """This CPU's float32 GEMM peak on the encoder's products (tokens x in -> out), in GFLOP/s: per shape the faster
    of MKL (`F.linear`) and oneDNN (`mkldnn._linear_pointwise`), best of `repeats` timings of about `flops` work each
    per thread; returns (peak, per-backend best)."""
    d, m = arch["hidden_size"], arch["intermediate_size"]
    size, patch = arch.get("image_size", IMAGE_SIZE), arch.get("patch_size", PATCH_SIZE)
    tokens = batch_size * ((size // patch) ** 2 + 1)
    backends = {"MKL": lambda x, w, b: F.linear(x, w, b)}
    if torch.backends.mkldnn.is_available():
        backends["oneDNN"] = lambda x, w, b: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    best = {name: 0.0 for name in backends}
    generator = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for fan_in, fan_out in ((d, 3 * d), (d, d), (d, m), (m, d)):
            x = torch.randn(tokens, fan_in, generator=generator)
            w, b = torch.randn(fan_out, fan_in, generator=generator) * 0.02, torch.zeros(fan_out)
            iterations = max(1, round(flops / (2 * tokens * fan_in * fan_out) / threads))
            for name, multiply in backends.items():
                multiply(x, w, b)
                for _ in range(repeats):
                    start = clock()
                    for _ in range(iterations):
                        multiply(x, w, b)
                    rate = 2 * tokens * fan_in * fan_out * iterations / (clock() - start) / 1e9
                    best[name] = max(best[name], rate)
    return max(best.values()), best


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
    versions = f"torch {torch.__version__}, timm {timm.__version__}, transformers {transformers.__version__}"
    if any(route.startswith("onnx") for route in args.routes) and args.device == "cpu":
        import onnxruntime

        versions += f", onnxruntime {onnxruntime.__version__}"
    if any(route.startswith("openvino") for route in args.routes) and importlib.util.find_spec("openvino"):
        import openvino

        versions += f", openvino {openvino.__version__.split('-')[0]}"
    if any(route.startswith(("onnx", "openvino")) for route in args.routes) and args.device == "cpu":
        versions += f", hubvit's ONNX at opset {args.opset}"
    dtype = "bf16 autocast" if args.device == "cuda" and args.dtype == "bfloat16" else args.dtype
    return f"{versions}; device {args.device} ({where}); dtype {dtype}; {args.clock} clock"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def case_record(case, throughput, differences, iterations, args, peak, peak_detail):
    """Everything one case measured, as plain data: what `--json` writes and what the tables are rendered from."""
    medians = {name: statistics.median(values) for name, values in throughput.items()}
    baseline = throughput.get("timm")
    routes = []
    for route in case.routes:
        values = throughput[route.name]
        routes.append(
            dict(
                name=route.name,
                library=route.library,
                kind=route.kind,
                reduced_precision=route.reduced_precision,
                images_per_second=medians[route.name],
                rounds=values,
                vs_timm_eager=paired_ratio(values, baseline) if baseline else None,
                gflops=medians[route.name] * case.flops_per_image() / 1e9,
                max_abs_dlogits_vs_hubvit=differences.get(route.name),
            )
        )
    record = dict(
        case=case.title,
        batch=case.batch_size,
        rounds=args.rounds,
        iterations=iterations,
        routes=routes,
        attention=case.backends,
        notes=case.notes,
        peak_gflops=peak,
        peak_detail=peak_detail,
        flops_per_image=case.flops_per_image(),
    )
    ours = [r.name for r in case.routes if r.library == "hubvit" and not r.reduced_precision]
    peers = [r.name for r in case.routes if r.library != "hubvit" and not r.reduced_precision]
    reduced = [r.name for r in case.routes if r.library == "hubvit" and r.reduced_precision]
    reduced_peers = [r.name for r in case.routes if r.library != "hubvit" and r.reduced_precision]
    summary = record["summary"] = {}
    if "hubvit" in throughput and baseline:
        summary["hubvit_vs_timm_eager"] = paired_ratio(throughput["hubvit"], baseline)
        if "transformers" in throughput:
            summary["hubvit_vs_transformers_eager"] = paired_ratio(throughput["hubvit"], throughput["transformers"])
        if "hubvit + optimize_for_cpu" in throughput:
            summary["optimize_for_cpu_vs_default"] = paired_ratio(
                throughput["hubvit + optimize_for_cpu"], throughput["hubvit"]
            )
        # "Best" by the per-round ratio to timm eager, not by medians, which may come from rounds under other loads.
        vs_baseline = {name: paired_ratio(throughput[name], baseline) for name in throughput}
        best_ours = max(ours, key=vs_baseline.get)
        summary["best_hubvit_fp32"] = best_ours
        summary["best_hubvit_fp32_vs_timm_eager"] = paired_ratio(best_per_round(throughput, ours), baseline)
        if peers:
            summary["best_peer_fp32"] = max(peers, key=vs_baseline.get)
            summary["best_hubvit_fp32_vs_best_peer_fp32"] = paired_ratio(
                best_per_round(throughput, ours), best_per_round(throughput, peers)
            )
        if reduced:
            summary["best_hubvit_reduced"] = max(reduced, key=vs_baseline.get)
            summary["best_hubvit_reduced_vs_timm_eager"] = paired_ratio(best_per_round(throughput, reduced), baseline)
            if reduced_peers:
                summary["best_peer_reduced"] = max(reduced_peers, key=vs_baseline.get)
                summary["best_hubvit_reduced_vs_best_peer_reduced"] = paired_ratio(
                    best_per_round(throughput, reduced), best_per_round(throughput, reduced_peers)
                )
        if peak:
            summary["hubvit_percent_of_peak"] = 100 * medians["hubvit"] * case.flops_per_image() / 1e9 / peak
            summary["best_hubvit_fp32_percent_of_peak"] = 100 * medians[best_ours] * case.flops_per_image() / 1e9 / peak
    return record


def ratio_text(value, suffix=""):
    return "n/a" if value is None else f"{value:.2f}x{suffix}"


def print_case(record, isa):
    """The case's per-route table, rendered from its record."""
    backends = ", ".join(f"{name} {value}" for name, value in record["attention"].items())
    print(
        f"\n{record['case']}, batch {record['batch']}: {record['rounds']} rounds x {record['iterations']} steps; "
        f"CPU ISA {isa}; attention: {backends}"
    )
    for note in record["notes"]:
        print(note)
    if record["peak_gflops"]:
        print(f"GEMM peak on the encoder's shapes: {record['peak_gflops']:.0f} GFLOP/s ({record['peak_detail']})")
    rows = []
    for route in record["routes"]:
        difference = route["max_abs_dlogits_vs_hubvit"]
        rows.append(
            [
                route["name"] + (" (reduced precision)" if route["reduced_precision"] else ""),
                f"{route['images_per_second']:.1f}",
                ratio_text(route["vs_timm_eager"]),
                f"{route['gflops']:.0f}",
                "(reference)" if route["name"] == "hubvit" else ("n/a" if difference is None else f"{difference:.1e}"),
            ]
        )
    print(table(["route", "img/s", "vs timm eager", "GFLOP/s", "max abs dlogits vs hubvit"], rows))


def summary_row(record):
    summary = record["summary"]
    row = [
        record["case"],
        str(record["batch"]),
        ratio_text(summary.get("hubvit_vs_timm_eager")),
        ratio_text(summary.get("hubvit_vs_transformers_eager")),
        ratio_text(summary.get("optimize_for_cpu_vs_default")),
    ]
    best = summary.get("best_hubvit_fp32")
    row.append(ratio_text(summary.get("best_hubvit_fp32_vs_timm_eager"), f" ({best})" if best else ""))
    peer = summary.get("best_peer_fp32")
    row.append(ratio_text(summary.get("best_hubvit_fp32_vs_best_peer_fp32"), f" (vs {peer})" if peer else ""))
    reduced = summary.get("best_hubvit_reduced")
    row.append(ratio_text(summary.get("best_hubvit_reduced_vs_timm_eager"), f" ({reduced})" if reduced else ""))
    peer = summary.get("best_peer_reduced")
    row.append(ratio_text(summary.get("best_hubvit_reduced_vs_best_peer_reduced"), f" (vs {peer})" if peer else ""))
    for key in ("hubvit_percent_of_peak", "best_hubvit_fp32_percent_of_peak"):
        row.append(f"{summary[key]:.0f}%" if key in summary else "")
    return row


SUMMARY_HEADER = [
    "case",
    "batch",
    "hubvit / timm eager",
    "hubvit / transformers eager",
    "optimize_for_cpu / default",
    "best hubvit fp32 / timm eager",
    "best hubvit fp32 / best peer fp32",
    "best hubvit reduced precision / timm eager fp32",
    "best hubvit reduced / best peer reduced",
    "hubvit % of peak",
    "best hubvit fp32 % of peak",
]


def render(report):
    """Print every table of a report (a fresh run's, or one read back with --from-json)."""
    print(report["environment"])
    print(f"CPU ISA: {report['isa']}")
    for record in report["cases"]:
        print_case(record, report["isa"])
    print_summary(report)


def print_summary(report):
    """The summary table of every case, and what its figures count."""
    print(f"\nCPU ISA: {report['isa']}")
    print(table(SUMMARY_HEADER, [summary_row(record) for record in report["cases"]]))
    print(
        f"\nViT-B/16 forward = {forward_flops(ARCHITECTURES['b16']) / 1e9:.1f} GFLOP per image, training step = 3x "
        "forward. GFLOP/s and % of peak count the whole forward's work for every route, so the routes that skip the "
        "last block's patch tokens (hubvit's ONNX classifier, optimize_for_cpu: about 6% less work on 12 blocks) "
        "count the work they avoid. Peak: CPU float32 GEMM measured above (inference cases); CUDA: bf16 dense from "
        "the data sheet (MFU). Reduced-precision routes (int8, bf16, OpenVINO's default precision) are left out of "
        "the fp32 comparisons."
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
    parser.add_argument(
        "--routes",
        default=None,
        help="comma-separated: eager, cpu (hubvit.optimize_for_cpu), compile, freezing (compile with inductor "
        "freezing, CPU inference), onnx (onnxruntime, CPU inference; hubvit and timm), onnx-fused (hubvit's ONNX "
        "with onnxruntime's fused attention and GELU, `--onnxruntime_fusion`), openvino (OpenVINO f32 on "
        "the ONNX file), openvino-default (OpenVINO's default precision), int8 (optimize_for_cpu(precision='int8')), "
        "onnx-int8 (hubvit's fused ONNX quantized by `hubvit export onnx --int8`), bf16 (CPUs with native bfloat16: "
        "optimize_for_cpu(precision='bf16'); timm and transformers under torch.autocast), flash (CUDA: sdpa forced to flash "
        f"attention). CPU default {','.join(CPU_ROUTES)}; CUDA default {','.join(CUDA_ROUTES)}",
    )
    parser.add_argument("--json", metavar="PATH", default=None, help="also write every figure measured to PATH")
    parser.add_argument(
        "--from-json", metavar="PATH", default=None, help="print the tables of a --json file; measure nothing"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a 2-layer model at 32 px, batch 2, 2 rounds of 1 step, a 100x shorter GEMM-peak probe",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch (and onnxruntime) CPU threads")
    parser.add_argument(
        "--opset", type=int, default=None, help="opset of hubvit's ONNX export (default: `hubvit export onnx`'s)"
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or this process's CPU time (with --threads 1: the work done, robust to a loaded machine)",
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="accelerator peak for MFU (bf16 dense)")
    args = parser.parse_args(argv)
    if args.from_json:
        import json

        render(json.loads(open(args.from_json, encoding="utf-8").read()))
        return
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.opset is None:
        from hubvit.conversion.export_onnx import OPSET

        args.opset = OPSET
    args.routes = args.routes or ",".join(CUDA_ROUTES if args.device == "cuda" else CPU_ROUTES)
    args.libraries = [name.strip() for name in args.libraries.split(",") if name.strip()]
    args.routes = [name.strip() for name in args.routes.split(",") if name.strip()]
    if args.quick:
        args.models = args.models or ",".join(QUICK_CASES)
        args.batch_size, args.rounds, args.warmup, args.iterations = args.batch_size or 2, 2, 1, args.iterations or 1
    cases = args.models.split(",") if args.models else (CUDA_CASES if args.device == "cuda" else CPU_CASES)
    for key in cases:
        arch, _, mode = key.partition("-")
        if arch not in ARCHITECTURES or mode not in ("infer", "train"):
            parser.error(
                f"--models: unknown case {key!r}; expected <arch>-<infer|train> with arch in {list(ARCHITECTURES)}"
            )
    for name in args.libraries:
        if name not in LIBRARIES:
            parser.error(f"--libraries: unknown library {name!r}; expected some of {list(LIBRARIES)}")
    for name in args.routes:
        if name not in ROUTE_KINDS:
            parser.error(f"--routes: unknown route {name!r}; expected some of {list(ROUTE_KINDS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    import tempfile
    from pathlib import Path

    from hubvit.cpu import cpu_isa

    environment = describe_environment(args)
    isa = cpu_isa() if args.device == "cpu" else f"{cpu_isa()} (host); GPU {torch.cuda.get_device_name()}"
    print(environment)
    print(f"CPU ISA: {isa}")
    accelerator_peak = peak_tflops(args)
    report = dict(
        environment=environment,
        isa=isa,
        command=["benchmarks/benchmark.py", *(argv or sys.argv[1:])],
        threads=args.threads,
        clock=args.clock,
        cases=[],
    )
    with tempfile.TemporaryDirectory() as folder:
        for key in cases:
            (Path(folder) / key).mkdir()
            case = Case(key, args, Path(folder) / key)
            differences = case.parity()
            throughput, iterations = run_case(case, args)
            peak, detail = None, None
            if args.device == "cpu" and case.mode == "infer":
                clock = time.process_time if args.clock == "cpu" else time.perf_counter
                peak, per_backend = gemm_peak(
                    case.arch, case.batch_size, args.threads, clock, flops=2e8 if args.quick else 2e10
                )
                detail = ", ".join(f"{name} {rate:.0f}" for name, rate in per_backend.items())
            elif accelerator_peak:
                peak, detail = accelerator_peak * 1e3, "bf16 dense, data sheet"
            if any(route.kind == "cpu" for route in case.routes):
                from hubvit.cpu import CHOOSER

                picks = ", ".join(
                    f"{rows}x{inner}->{outer}: {kernel}"
                    for (rows, inner, outer, _), kernel in sorted(CHOOSER.choices.items())
                )
                case.notes.append(f"optimize_for_cpu's probe chose (rows x inner -> outer): {picks}")
                if CHOOSER.layer_choices:
                    layers = ", ".join(
                        f"{'x'.join(map(str, shape))}->{fan_out}: {route} ({CHOOSER.layer_timings[key]['pytorch'] * 1e3:.1f} "
                        f"vs {CHOOSER.layer_timings[key]['chosen'] * 1e3:.1f} ms)"
                        for key, route in sorted(CHOOSER.layer_choices.items())
                        for shape, _, fan_out in [key[:3]]
                    )
                    case.notes.append(
                        "where a product chose oneDNN, the layer's forward and backward timed together (PyTorch's "
                        f"own vs the chosen kernels) kept: {layers}"
                    )
                CHOOSER.clear()
            record = case_record(case, throughput, differences, iterations, args, peak, detail)
            report["cases"].append(record)
            print_case(record, isa)
            del case
            if args.device == "cuda":
                torch.cuda.empty_cache()
    print_summary(report)
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
