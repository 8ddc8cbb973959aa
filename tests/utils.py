"""Helpers shared by the tests: tiny configs, fully random weights, tolerances, and a Python with hubvit hidden."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import torch

# float32 parity: the same operations in another order differ by a few ulps of the output scale.
RTOL = 1e-5

# The tiny sizes every test builds at: 2 blocks of width 32-48 on 32 x 32 images with 8 x 8 patches (a 4 x 4 grid),
# in each library's own keyword names.
TINY = dict(
    image_size=32,
    patch_size=8,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
)
SAM_PARTS = dict(
    class_token=False,
    pooling="mean",
    final_norm=False,
    attention_window_size=3,
    global_attention_blocks=[1],
    decomposed_relative_position=True,
    neck_size=16,
)
"""Segment Anything's parts on a tiny model (modeling/windows_hubvit.py): windows of 3 with block 1 global,
decomposed relative positions, a 16-channel neck; a 32 x 32 image's 4 x 4 grid pads to 6 x 6."""

TINY_TIMM = dict(depth=2, embed_dim=48, num_heads=4, img_size=32, patch_size=8)
TINY_TORCHVISION = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=48, mlp_dim=96)
TINY_PYTORCH = dict(image_size=32, patch_size=8, dim=48, depth=2, heads=4, mlp_dim=96)


# The environment variable OpenVINO's telemetry reads to stay silent (tests/conftest.py: decline_openvino_telemetry),
# for subprocesses that may import openvino.
NO_OPENVINO_TELEMETRY = {"CI": "true"}


def tiny_config(**overrides):
    from hubvit import HubViTConfig

    return HubViTConfig(**{**TINY, **overrides})


def _is_norm_or_scale(name):
    """LayerNorm weights and layer-scale factors in hubvit's, timm's and torchvision's names (1 at initialisation)."""
    module, _, leaf = name.rpartition(".")
    last = module.rpartition(".")[2]
    return (leaf == "weight" and ("norm" in last or last.startswith("ln"))) or leaf == "gamma" or "scale" in leaf


def _is_table(name):
    """Tokens, position tables and attention-pooling probes: not matrices with a fan-in."""
    return any(key in name for key in ("token", "position", "pos_embed", "pos_embedding", "probe", "latent"))


@torch.no_grad()
def randomize_(model, seed=0, scale=0.5):
    """Give every parameter random values far from 0 and 1, so a swapped or skipped tensor changes the output.

    Libraries initialise biases to 0 and norms to 1, which hides a swap: norms and layer scales get 1 + 0.2 N(0, 1),
    matrices N(0, 1) / sqrt(fan-in) (outputs stay O(1) through the depth), everything else `scale` N(0, 1).
    Works on hubvit, timm and torchvision models.
    """
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=generator)
        if _is_norm_or_scale(name):
            param.copy_(1.0 + 0.2 * noise)
        elif param.ndim >= 2 and not _is_table(name):
            param.copy_(noise / param[0].numel() ** 0.5)
        else:
            param.copy_(scale * noise)
    return model


def relative_error(ours, reference):
    """max |ours - reference| over max |reference|: the float32 parity measure of the tests (tensors or arrays)."""
    if isinstance(ours, torch.Tensor) or isinstance(reference, torch.Tensor):
        ours, reference = torch.as_tensor(ours).double(), torch.as_tensor(reference).double()
        return ((ours - reference).abs().max() / reference.abs().max()).item()
    ours, reference = np.asarray(ours, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    return float(np.abs(ours - reference).max() / np.abs(reference).max())


def assert_close(actual, expected, what="output", *, rtol=RTOL):
    """Same shape, and max |actual - expected| within `rtol` of the largest |expected| (floored at 1e-6)."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if expected.numel() == 0:
        return
    scale = expected.abs().max().clamp_min(1e-6)
    diff = (actual - expected).abs().max()
    assert diff <= rtol * scale, f"{what}: max diff {diff:.3g} > {rtol:g} x output scale {scale:.3g}"


def run_without_hubvit(code, cwd):
    """Run `code` in a fresh Python where `import hubvit` fails (hidden, not uninstalled); returns parsed JSON stdout.

    The code must print one JSON document as its last line of output.
    """
    prelude = "import sys\nsys.modules['hubvit'] = None\n"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise AssertionError(f"isolated run failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def mlp_tokens_per_block(onnx_path, pixel_values):
    """How many tokens each encoder block's MLP computes in an exported graph: onnxruntime runs it with every
    block's first MLP projection as an extra output."""
    import onnx
    import onnxruntime

    from hubvit.conversion.fuse_onnx import encoder_blocks

    model = onnx.load(str(onnx_path))
    blocks = encoder_blocks(model.graph)
    names = [blocks[index].output("mlp.fc1") for index in sorted(blocks)]
    model.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in names)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [output.shape[1] for output in session.run(names, {"pixel_values": pixel_values.numpy()})]
