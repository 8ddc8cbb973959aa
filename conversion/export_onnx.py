"""`hubvit export onnx SRC OUT.onnx`: one ONNX graph for every batch size, height and width.

The graph comes from `torch.onnx.export(..., dynamo=True)` (torch.export underneath) with the batch and the patch
grid as symbolic dimensions, so the position table is resized inside the graph exactly as the PyTorch model resizes
it; a classifier's last block runs for the tokens its head reads alone (`Outputs`). Before anything is written the
graph runs in onnxruntime next to PyTorch's full forward at the export size and two others (one larger, one
non-square); the figures are printed and stored beside the graph as OUT.verification.json. The image
processor's settings (mean, std, size, resample, rescaling) and the label names travel in the ONNX metadata_props,
so a runtime without transformers can preprocess and label.
"""

import contextlib
import importlib.util
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..limits import check_side_file, write_text_atomic
from ..options import argument, flag, option, settle, whole
from .common import ConversionError, ExportOptions, ExportResult, read_hubvit_config
from ..folder import check_output_path
from ..modeling.naflex_hubvit import sequence_problem
from .fuse_onnx import LAST_BLOCK_QUERIES, fuse_for_onnxruntime
from .quantize_onnx import quantize_in_place

logger = logging.getLogger(__name__)

TOLERANCE = 1e-4
# The opset torch.onnx writes by default: exact GELU is one `Gelu` operator (opset 20), which onnxruntime runs faster
# than opset 18's Erf arithmetic (docs/conversion.md). 18 is the oldest the exporter writes.
OPSET = 20
MIN_OPSET = 18


@dataclass(frozen=True)
class Options(ExportOptions):
    """Write the hubvit folder SRC as one ONNX graph OUT (`.onnx`) with dynamic batch, height and width, after
    onnxruntime reproduces PyTorch within `tolerance` at three sizes (the figures also go to OUT.verification.json).
    `onnxruntime_fusion` writes attention and GELU as onnxruntime's fused operators (a graph for onnxruntime only);
    `int8` fuses them too, then quantizes the encoder projections (dynamic, onnxruntime) and records their agreement
    in that file."""

    out: str = argument("OUT", "the .onnx file to write (OUT.verification.json is written beside)")
    opset: int = option(OPSET, f"ONNX opset ({OPSET})")
    tolerance: float = option(TOLERANCE, "max |onnxruntime - PyTorch| / max |PyTorch| (1e-4)")
    int8: bool = option(
        False, "quantize the encoder projections to int8 (onnxruntime, dynamic; implies --onnxruntime_fusion)"
    )
    onnxruntime_fusion: bool = option(
        False,
        "attention and GELU as onnxruntime's fused operators: faster in onnxruntime, not readable by OpenVINO",
    )
    patch_sequences: bool = option(
        False,
        "take images at their own sizes as padded patch sequences (pixel_values (batch, patches, P*P*C), "
        "pixel_attention_mask, spatial_shapes: SigLIP 2's NaFlex input) instead of (batch, C, H, W)",
    )

    def __post_init__(self):
        super().__post_init__()
        settle(
            self,
            opset=whole(self.opset, "opset", minimum=7, optional=False),
            int8=flag(self.int8, "int8"),
            onnxruntime_fusion=flag(self.onnxruntime_fusion, "onnxruntime_fusion"),
            patch_sequences=flag(self.patch_sequences, "patch_sequences"),
        )
        if self.patch_sequences and (self.int8 or self.onnxruntime_fusion):
            raise ConversionError("--patch_sequences writes the plain graph: drop --int8 and --onnxruntime_fusion")


def run(options: Options) -> ExportResult:
    check_output_path(options.out, options.src, is_file=True)
    return export(options)


class Outputs(torch.nn.Module):
    """The model as a function of `pixel_values` alone, returning plain tensors: logits, or the body's outputs.

    A classifier whose head reads only the leading tokens ([CLS], distillation) runs its last block for those tokens
    alone: the graph's only output is the logits, which do not change, and a 12-block model does about 6% less
    work. `skip_unread_tokens=False` gives the model's own forward.
    """

    def __init__(self, model, skip_unread_tokens=True):
        super().__init__()
        self.model = model
        classifier = hasattr(model, "classifier")
        self.names = ["logits"] if classifier else ["last_hidden_state"]
        if not classifier and model.config.pooling_kind.pools:
            self.names.append("pooler_output")
        self.num_output_tokens = model.hubvit.pooler.num_tokens_read if classifier and skip_unread_tokens else None

    def forward(self, pixel_values):
        skip = {} if self.num_output_tokens is None else {"num_output_tokens": self.num_output_tokens}
        outputs = self.model(pixel_values=pixel_values, **skip)
        return tuple(outputs[name] for name in self.names)


def load(src):
    """The hubvit model in SRC (classifier, or body when it has no labels) and its image processor settings."""
    from transformers import AutoImageProcessor

    from .. import folder
    from ..modeling import HubViTModel

    src = Path(src)
    config, raw = read_hubvit_config(src)
    headless = not config.num_labels or raw.get("architectures") == [HubViTModel.__name__]
    model = folder.load(src, classifier=not headless, attn_implementation="sdpa")
    processor = None
    if (src / "preprocessor_config.json").is_file():
        processor = AutoImageProcessor.from_pretrained(str(src)).to_dict()
    return model, processor


def check_sizes(config):
    """(height, width) of the export and of the two check sizes: larger by two patches, and non-square."""
    (height, width), (ph, pw) = config.image_size_2d, config.patch_size_2d
    return [(height, width), (height + 2 * ph, width + 2 * pw), (max(ph, height - ph), width + 2 * pw)]


def metadata(model, processor):
    config = model.config
    props = {
        "model_type": config.model_type,
        "input": "pixel_values: float32 (batch, channels, height, width), height and width multiples of patch_size",
        "outputs": ",".join(Outputs(model).names),
        "image_size": json.dumps(list(config.image_size_2d)),
        "patch_size": json.dumps(list(config.patch_size_2d)),
        "num_channels": str(config.num_channels),
    }
    if processor is not None:
        props["preprocessor_config"] = json.dumps(processor, sort_keys=True, default=str)
        for key in (
            "image_mean",
            "image_std",
            "size",
            "resample",
            "do_resize",
            "do_rescale",
            "rescale_factor",
            "do_normalize",
        ):
            if key in processor:
                props[key] = json.dumps(processor[key], default=str)
    if "logits" in props["outputs"]:
        props["id2label"] = json.dumps({str(k): v for k, v in config.id2label.items()})
    return props


@contextlib.contextmanager
def resize_by_matrices():
    """While exporting, the position tables are resized by the model's `resize_position_grid_by_matrices`: the
    interpolation weights computed in the graph from the input size, applied as two 2D matrix products, where
    `F.interpolate` would become an ONNX `Resize` whose cubic + antialias variant OpenVINO computes differently."""
    from ..modeling import resize_hubvit

    original = resize_hubvit.resize_position_grid
    resize_hubvit.resize_position_grid = resize_hubvit.resize_position_grid_by_matrices
    try:
        yield
    finally:
        resize_hubvit.resize_position_grid = original


def export_graph(model, path, opset=OPSET):
    """Write `model` (a hubvit model in eval mode) as ONNX with dynamic batch, height and width."""
    config = model.config
    (height, width), (ph, pw) = config.image_size_2d, config.patch_size_2d
    wrapper = Outputs(model).eval()
    example = torch.randn(2, config.num_channels, height, width, generator=torch.Generator().manual_seed(0))
    rows, columns = torch.export.Dim("grid_height", min=1), torch.export.Dim("grid_width", min=1)
    dynamic = {"pixel_values": {0: torch.export.Dim("batch", min=1), 2: ph * rows, 3: pw * columns}}
    with torch.no_grad(), resize_by_matrices():
        program = torch.onnx.export(
            wrapper,
            (example,),
            dynamo=True,
            dynamic_shapes=dynamic,
            input_names=["pixel_values"],
            output_names=wrapper.names,
            opset_version=opset,
            verbose=False,
        )
    if wrapper.num_output_tokens is not None:
        program.model.metadata_props[LAST_BLOCK_QUERIES] = str(wrapper.num_output_tokens)
    program.save(str(path))
    return wrapper.names


SEQUENCE_INPUTS = ("pixel_values", "pixel_attention_mask", "spatial_shapes")


class SequenceOutputs(Outputs):
    """`Outputs` of a batch of patch sequences (modeling/naflex_hubvit.py)."""

    def forward(self, pixel_values, pixel_attention_mask, spatial_shapes):
        outputs = self.model(
            pixel_values=pixel_values, pixel_attention_mask=pixel_attention_mask, spatial_shapes=spatial_shapes
        )
        return tuple(outputs[name] for name in self.names)


def sequence_batch(config, sizes, budget, seed):
    """A batch of random images of `sizes` as SigLIP 2's processor writes them, under a `budget` of patches."""
    import numpy as np
    from transformers import Siglip2ImageProcessor

    (ph, pw), rng = config.patch_size_2d, np.random.default_rng(seed)
    if ph != pw or config.num_channels != 3:
        raise ConversionError("--patch_sequences checks the graph with SigLIP 2's processor: square patches, RGB")
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    processor = Siglip2ImageProcessor(patch_size=ph, max_num_patches=budget)
    return {key: value for key, value in processor(images=images, return_tensors="pt").items()}


def sequence_checks(config):
    """Two mixed batches: four aspect ratios under the native patch count, three under a larger budget."""
    (height, width), (p, _) = config.image_size_2d, config.patch_size_2d
    budget = (height // p) * (width // p)
    first = [(height, 2 * width), (2 * height, width // 2 or p), (height, width), (height // 2 or p, 3 * width)]
    return [sequence_batch(config, first, budget, 0), sequence_batch(config, first[:3], budget + budget // 2, 1)]


def export_sequence_graph(model, path, opset=OPSET):
    """Write `model` as ONNX taking patch sequences, with dynamic batch and sequence length."""
    wrapper = SequenceOutputs(model, skip_unread_tokens=False).eval()
    example = sequence_checks(model.config)[0]
    batch, length = torch.export.Dim("batch", min=1), torch.export.Dim("patches", min=2)
    dynamic = {"pixel_values": {0: batch, 1: length}, "pixel_attention_mask": {0: batch, 1: length}}
    dynamic["spatial_shapes"] = {0: batch}
    with torch.no_grad(), resize_by_matrices():
        program = torch.onnx.export(
            wrapper,
            tuple(example[name] for name in SEQUENCE_INPUTS),
            dynamo=True,
            dynamic_shapes=dynamic,
            input_names=list(SEQUENCE_INPUTS),
            output_names=wrapper.names,
            opset_version=opset,
            verbose=False,
        )
    program.save(str(path))
    return wrapper.names


def verify_sequences(model, path, names, openvino=True):
    """max |runtime - PyTorch| / max |PyTorch| per runtime and output on two mixed batches (the real patches only);
    height and width in the rows are the largest grid's rows and columns."""
    import numpy as np

    rows = []
    for runtime, run in runtimes(path, openvino).items():
        for batch in sequence_checks(model.config):
            inputs = [batch[name] for name in SEQUENCE_INPUTS]
            with torch.no_grad():
                expected = SequenceOutputs(model, skip_unread_tokens=False)(*inputs)
            actual = run(names, {name: value.numpy() for name, value in zip(SEQUENCE_INPUTS, inputs)})
            prefix = np.ones((len(inputs[2]), model.config.num_prefix_tokens), bool)
            keep = np.concatenate([prefix, inputs[1].numpy().astype(bool)], axis=1)
            height, width = (int(v) for v in inputs[2].max(0).values)
            for name, ours, theirs in zip(names, actual, expected):
                theirs = theirs.numpy()
                if name == "last_hidden_state":
                    ours, theirs = ours[keep], theirs[keep]
                rows.append(check_row(runtime, name, len(inputs[2]), height, width, ours, theirs))
    return rows


def fuse_in_place(path, config):
    """Rewrite the graph at `path` with onnxruntime's fused attention and GELU; returns the counts fused."""
    import onnx

    graph = onnx.load(str(path))
    counts = fuse_for_onnxruntime(graph, config)
    onnx.save(graph, str(path))
    logger.info("onnxruntime fusion: %s", ", ".join(f"{count} {name}" for name, count in counts.items()))
    return counts


def runtimes(path, openvino=True):
    """{name: run(names, feed) -> arrays} for onnxruntime and, where it is installed and `openvino`, OpenVINO
    (pinned to float32: its default on CPUs with bf16 support is bf16, which is no check of the graph); `feed` maps
    the graph's input names to arrays."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    found = {"onnxruntime": session.run}
    if openvino and importlib.util.find_spec("openvino") is not None:
        import openvino

        compiled = openvino.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})

        def run_openvino(names, feed):
            results = compiled(feed)
            return [results[compiled.output(name)] for name in names]

        found["openvino"] = run_openvino
    return found


def check_row(runtime, name, batch, height, width, ours, theirs):
    """One line of OUT.verification.json: how far a runtime's output is from PyTorch's."""
    import numpy as np

    return dict(
        runtime=runtime,
        output=name,
        batch=batch,
        height=height,
        width=width,
        max_abs_difference=float(np.abs(ours - theirs).max()),
        max_abs_output=float(np.abs(theirs).max()),
    )


def verify(model, path, names, openvino=True):
    """max |runtime - PyTorch| / max |PyTorch| per runtime and output at the export size and the two check sizes,
    PyTorch running the model's own forward (every token through every block)."""

    rows = []
    for runtime, run in runtimes(path, openvino).items():
        generator = torch.Generator().manual_seed(1)
        for index, (height, width) in enumerate(check_sizes(model.config)):
            batch = (2, 1, 3)[index % 3]
            pixels = torch.randn(batch, model.config.num_channels, height, width, generator=generator)
            with torch.no_grad():
                expected = Outputs(model, skip_unread_tokens=False)(pixels)
            actual = run(names, {"pixel_values": pixels.numpy()})
            for name, ours, theirs in zip(names, actual, expected):
                theirs = theirs.numpy()
                if ours.shape != theirs.shape:
                    raise ConversionError(
                        f"{runtime} gave {name} of shape {ours.shape} at {height}x{width}, PyTorch {theirs.shape}"
                    )
                rows.append(check_row(runtime, name, batch, height, width, ours, theirs))
    return rows


def export(args):
    """Write the hubvit folder `args.src` as the ONNX graph `args.out`, checked in onnxruntime first; `args` is an
    `Options`."""
    try:
        import onnx
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ModuleNotFoundError as error:
        raise ConversionError(f"ONNX export needs {error.name}: pip install 'hubvit[onnx]'") from None
    out = Path(args.out)
    if out.suffix != ".onnx":
        raise ConversionError(f"OUT={str(out)!r} should end in .onnx")
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= args.opset <= newest:
        raise ConversionError(
            f"opset={args.opset}; expected an integer from {MIN_OPSET} (the oldest torch.onnx's exporter "
            f"writes) to {newest} (the newest the installed onnx knows)"
        )
    report = out.with_suffix(".verification.json")
    check_side_file(out, args.overwrite, "OUT")
    check_side_file(report, args.overwrite, "the verification report")
    model, processor = load(args.src)
    problem = sequence_problem(model.config) if args.patch_sequences else None
    if problem is not None:
        raise ConversionError(f"--patch_sequences: {problem}; export without it")
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{out.name[:100]}.", suffix=".onnx", dir=out.parent)
    os.close(handle)
    staging = Path(staging)
    try:
        if args.patch_sequences:
            names, fused = export_sequence_graph(model, staging, args.opset), None
            rows = verify_sequences(model, staging, names)
        else:
            names = export_graph(model, staging, args.opset)
            fused = fuse_in_place(staging, model.config) if args.onnxruntime_fusion or args.int8 else None
            rows = verify(model, staging, names, openvino=fused is None)
        notes = tuple(
            f"verify {row['output']} batch {row['batch']} at {row['height']}x{row['width']}: "
            f"max |{row['runtime']} - torch| = {row['max_abs_difference']:.2e} (max |{row['output']}| = "
            f"{row['max_abs_output']:.3g}, relative "
            f"{row['max_abs_difference'] / max(row['max_abs_output'], 1e-12):.1e})"
            for row in rows
        )
        worst = max(rows, key=lambda r: r["max_abs_difference"] / max(r["max_abs_output"], 1e-12))
        if worst["max_abs_difference"] > args.tolerance * worst["max_abs_output"]:
            raise ConversionError(
                f"{worst['runtime']} does not reproduce PyTorch at {worst['height']}x{worst['width']}: max |Δ{worst['output']}| "
                f"{worst['max_abs_difference']:.3g} > {args.tolerance:g} x {worst['max_abs_output']:.3g}; nothing was written"
            )
        import onnx

        graph = onnx.load(str(staging))
        props = metadata(model, processor)
        if args.patch_sequences:
            props["input"] = (
                "pixel_values: float32 (batch, patches, patch*patch*channels) in row, column, channel order; "
                "pixel_attention_mask: int64 (batch, patches); spatial_shapes: int64 (batch, 2), each image's grid"
            )
        for key, value in props.items():
            entry = graph.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.save(graph, str(staging))
        int8 = quantize_in_place(staging, model) if args.int8 else None
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o666 & ~umask)
        staging.replace(out)
    finally:
        staging.unlink(missing_ok=True)
    summary = dict(
        source=str(args.src),
        onnx=out.name,
        opset=args.opset,
        tolerance=args.tolerance,
        torch=torch.__version__,
        onnxruntime=__import__("onnxruntime").__version__,
        checks=rows,
        onnxruntime_fusion=fused,
        int8=int8,
    )
    write_text_atomic(report, json.dumps(summary, indent=2) + "\n")
    logger.info("wrote %s and %s", out, report.name)
    worst = max(row["max_abs_difference"] for row in rows)
    lines = [
        f"{row['output']} batch {row['batch']} at {row['height']}x{row['width']}: max |Δ| = "
        f"{row['max_abs_difference']:.2e}"
        for row in rows
    ]
    return ExportResult(out, worst, tuple(lines), notes + ((int8["line"],) if int8 else ()))
