"""Helpers shared by the tests: tiny configs, fully random weights, and a Python with hubvit hidden."""

import json
import os
import subprocess
import sys
import textwrap

import torch

TINY = dict(
    image_size=32,
    patch_size=8,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
)


def tiny_config(**overrides):
    from hubvit import HubViTConfig

    return HubViTConfig(**{**TINY, **overrides})


@torch.no_grad()
def randomize_(model, seed=0, scale=0.5):
    """Give every parameter random values far from 0 and 1, so a swapped or skipped tensor changes the output."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=generator)
        if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "layernorm.weight")) or "scale" in name:
            param.copy_(1.0 + 0.2 * noise)
        elif param.ndim >= 2 and "token" not in name and "position" not in name and "probe" not in name:
            fan_in = param[0].numel()
            param.copy_(noise / fan_in**0.5)
        else:
            param.copy_(scale * noise)
    return model


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
