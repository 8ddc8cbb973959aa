"""onnxruntime's fused operators in an exported hubvit graph (`hubvit export onnx --onnxruntime_fusion`, and
always under `--int8`).

The exporter writes each encoder block's attention as some twenty standard operators (reshape, three slices,
transposes, two scaled matrix products, softmax) and exact GELU as Erf arithmetic. onnxruntime has one kernel for
each: `com.microsoft.MultiHeadAttention` takes the qkv projection's output split in three (hubvit's qkv rows are
[q; k; v], each head-major, which is the layout the kernel reads) and `com.microsoft.Gelu` / `FastGelu` the first
MLP projection's output. The fused graph runs in onnxruntime only (OpenVINO does not read the `com.microsoft`
domain), which is why the plain export stays the default. Each block is located from the exporter's node metadata
(the module scope of the projections), the region between the projections is bypassed, and the operators nothing
reads any more are removed. Blocks whose attention layer is not fusable (`HubViTAttention.fusable`: a bias on the
logits, a rotation, q/k norm, q and v biases only, separate projections, windows) keep their attention as exported,
and a gated MLP keeps its activation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..modeling.layers_hubvit import MLP_KINDS, HubViTAttention
from ..modeling.rotary_hubvit import Positions
from .common import ConversionError

DOMAIN = "com.microsoft"
LAST_BLOCK_QUERIES = "hubvit.last_block_queries"
PROJECTION = re.compile(r"encoder\.layers\.(\d+)\.(attention\.qkv|attention\.proj|mlp\.fc1|mlp\.fc2)'")
ACTIVATIONS = {"gelu": "Gelu", "gelu_pytorch_tanh": "FastGelu"}


@dataclass
class Block:
    """The projections of one encoder block, as graph nodes in graph order."""

    nodes: dict[str, list] = field(default_factory=dict)

    def output(self, name):
        """The tensor a projection produces (its bias Add, or the MatMul without a bias)."""
        return self.nodes[name][-1].output[0]

    def matmul(self, name):
        return next(node for node in self.nodes[name] if node.op_type in ("MatMul", "Gemm"))


def encoder_blocks(graph) -> dict[int, Block]:
    blocks: dict[int, Block] = {}
    for node in graph.node:
        scopes = next((entry.value for entry in node.metadata_props if entry.key == "pkg.torch.onnx.name_scopes"), "")
        found = PROJECTION.search(scopes)
        if found:
            block = blocks.setdefault(int(found.group(1)), Block())
            block.nodes.setdefault(found.group(2), []).append(node)
    return blocks


def attention_fusable(config):
    """Per block, whether its attention layer says it is fusable (`HubViTAttention.fusable`), asked of the layers
    themselves, built on the meta device."""
    import torch

    with torch.device("meta"):
        positions = Positions(config)
        return [HubViTAttention(config, positions, index).fusable for index in range(config.num_hidden_layers)]


def fuse_for_onnxruntime(model, config) -> dict[str, int]:
    """Rewrite the ONNX `model` (a ModelProto from `export_graph`) in place; returns how many of each were fused."""
    from onnx import helper

    graph = model.graph
    blocks = encoder_blocks(graph)
    if len(blocks) != config.num_hidden_layers:
        raise ConversionError(
            f"found {len(blocks)} encoder blocks in the exported graph's metadata, expected "
            f"{config.num_hidden_layers}: not a graph `export_graph` wrote"
        )
    before: dict[int, list] = {}
    properties = {entry.key: entry.value for entry in model.metadata_props}
    last_queries = int(properties[LAST_BLOCK_QUERIES]) if LAST_BLOCK_QUERIES in properties else None
    last = max(blocks)
    fusable = attention_fusable(config)
    activation = ACTIVATIONS.get(config.hidden_act) if MLP_KINDS[config.mlp_type].activation_reads_fc1 else None
    counts = {"MultiHeadAttention": 0, activation or "activation": 0}
    for index, block in sorted(blocks.items()):
        if fusable[index]:
            parts = [f"layers.{index}.{name}" for name in ("query", "key", "value")]
            attended = f"layers.{index}.attended"
            proj = block.matmul("attention.proj")
            inserted = [
                helper.make_node(
                    "Split", [block.output("attention.qkv")], parts, axis=-1, num_outputs=3, name=f"{attended}.split"
                )
            ]
            if last_queries is not None and index == last:
                inserted.extend(first_tokens(parts[0], last_queries))
                parts[0] = inserted[-1].output[0]
            inserted.append(
                helper.make_node(
                    "MultiHeadAttention",
                    parts,
                    [attended],
                    domain=DOMAIN,
                    num_heads=config.num_attention_heads,
                    name=attended,
                )
            )
            before.setdefault(id(proj), []).extend(inserted)
            proj.input[0] = attended
            counts["MultiHeadAttention"] += 1
        if activation:
            activated = f"layers.{index}.activated"
            fc2 = block.matmul("mlp.fc2")
            before.setdefault(id(fc2), []).append(
                helper.make_node(activation, [block.output("mlp.fc1")], [activated], domain=DOMAIN, name=activated)
            )
            fc2.input[0] = activated
            counts[activation] += 1
    nodes = []
    for node in graph.node:
        nodes.extend(before.get(id(node), []))
        nodes.append(node)
    keep_live(graph, nodes)
    if not any(entry.domain == DOMAIN for entry in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return counts


def first_tokens(name, count):
    """Nodes that slice the (batch, tokens, features) tensor `name` to its first `count` tokens: the queries of a
    last block that updates only the tokens the head reads (`Outputs` in export_onnx)."""
    from onnx import TensorProto, helper

    bounds = [
        helper.make_node(
            "Constant", [], [f"{name}.{key}"], value=helper.make_tensor(key, TensorProto.INT64, [1], [value])
        )
        for key, value in (("starts", 0), ("ends", count), ("axes", 1))
    ]
    inputs = [name] + [node.output[0] for node in bounds]
    return bounds + [helper.make_node("Slice", inputs, [f"{name}.first"], name=f"{name}.first")]


def keep_live(graph, nodes):
    """Set the graph's nodes to those the outputs read, in order, and drop the initializers nothing reads."""
    needed = {output.name for output in graph.output}
    live = []
    for node in reversed(nodes):
        if any(name in needed for name in node.output):
            live.append(node)
            needed.update(name for name in node.input if name)
    del graph.node[:]
    graph.node.extend(reversed(live))
    initializers = [tensor for tensor in graph.initializer if tensor.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
