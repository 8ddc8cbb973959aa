"""`hubvit export onnx --int8`: the exported graph with its encoder projections quantized by onnxruntime.

onnxruntime's dynamic quantizer turns each MatMul with a constant weight into int8 weights and activations
quantized per batch at run time (`MatMulInteger`). The patch embedding (a Conv), the pooler, the head and every
LayerNorm stay in float: only MatMuls whose weight is an encoder projection are quantized, the same layers
`optimize_for_cpu(model, precision="int8")` quantizes in PyTorch. The quantized graph is checked against the float
PyTorch model before it replaces the float one: largest logit error relative to the logit scale and top-1
agreement on a batch of random images at the export size (printed and stored in the verification report).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import torch

from .common import ConversionError

ENCODER_SCOPE = ".encoder.layers."
CHECK_BATCH = 16

logger = logging.getLogger(__name__)


def node_metadata(node) -> dict[str, str]:
    return {entry.key: entry.value for entry in node.metadata_props}


def constant_names(graph) -> set[str]:
    """Initializers and Constant outputs: the inputs a dynamic quantizer can store as int8 weights."""
    names = {tensor.name for tensor in graph.initializer}
    names.update(output for node in graph.node if node.op_type == "Constant" for output in node.output)
    return names


def is_encoder_projection(node, constants) -> bool:
    """A MatMul/Gemm that computes an `nn.Linear` inside an encoder block, read from the exporter's node metadata
    (`torch.onnx.export(dynamo=True)` records the module scope and the aten op; weight names are folded away)."""
    if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or node.input[1] not in constants:
        return False
    metadata = node_metadata(node)
    return (
        "aten.linear" in metadata.get("pkg.torch.onnx.fx_node", "")
        and ENCODER_SCOPE in metadata.get("pkg.torch.onnx.name_scopes", "")
        or ENCODER_SCOPE in node.input[1]
    )


def encoder_matmuls(graph) -> list[str]:
    """Names of the MatMul/Gemm nodes that are encoder projections (qkv, attention output, MLP in and out)."""
    constants = constant_names(graph)
    return [node.name for node in graph.node if is_encoder_projection(node, constants)]


def quantize_graph(src: Path, dst: Path) -> list[str]:
    """Write `src` with its encoder MatMuls int8 (dynamic activations) to `dst`; returns the quantized node names."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(src))
    encoder = encoder_matmuls(model.graph)
    if not encoder:
        raise ConversionError(f"{src}: found no encoder projection MatMul to quantize (is it a hubvit export?)")
    quantize_dynamic(
        model,
        dst,
        op_types_to_quantize=["MatMul", "Gemm"],
        nodes_to_quantize=encoder,
        weight_type=QuantType.QInt8,
        per_channel=False,
    )
    quantized = onnx.load(str(dst))
    del quantized.metadata_props[:]
    quantized.metadata_props.extend(model.metadata_props)
    entry = quantized.metadata_props.add()
    entry.key, entry.value = (
        "quantization",
        "int8 dynamic (onnxruntime): encoder projections; embedding, norms, head float",
    )
    onnx.save(quantized, str(dst))
    return encoder


def compare(model, path: Path, batch: int = CHECK_BATCH) -> dict:
    """The quantized graph against the float PyTorch model on random images at the export size."""
    import onnxruntime

    config = model.config
    height, width = config.image_size_2d
    pixels = torch.randn(batch, config.num_channels, height, width, generator=torch.Generator().manual_seed(2))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_outputs()[0].name
    (actual,) = session.run([name], {"pixel_values": pixels.numpy()})
    with torch.no_grad():
        outputs = model(pixel_values=pixels)
    expected = outputs[name].numpy() if name in outputs else outputs[0].numpy()
    scale = float(np.abs(expected).max())
    row = dict(
        output=name,
        batch=batch,
        height=height,
        width=width,
        max_abs_difference=float(np.abs(actual - expected).max()),
        max_abs_output=scale,
    )
    if actual.ndim == 2:
        row["top1_agreement"] = float((actual.argmax(-1) == expected.argmax(-1)).mean())
    return row


def quantize_in_place(path: Path, model) -> dict:
    """Replace the float graph at `path` by its int8 version and return the check against `model` (float)."""
    path = Path(path)
    with tempfile.TemporaryDirectory(dir=path.parent) as folder:
        target = Path(folder) / path.name
        nodes = quantize_graph(path, target)
        row = compare(model, target)
        target.replace(path)
    row["quantized_nodes"] = len(nodes)
    agreement = f", top-1 agreement {row['top1_agreement']:.3f}" if "top1_agreement" in row else ""
    row["line"] = (
        f"int8: {len(nodes)} encoder MatMuls quantized; max |int8 - float torch| {row['output']} = "
        f"{row['max_abs_difference']:.2e} (max |{row['output']}| {row['max_abs_output']:.3g}){agreement} "
        f"on {row['batch']} random images at {row['height']}x{row['width']}"
    )
    logger.info("%s", row["line"])
    return row
