"""The check of a converted model against the source implementation's own forward, on the same seeded inputs."""

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConversionError


@dataclass
class Verification:
    """What `verify` measured: the worst max |difference| and one line per output and size."""

    max_abs_diff: float
    lines: list

    def text(self, reference):
        return (
            f"{reference.description} and this model, same weights, seeded random float32 batches of "
            f"{reference.batch} images: " + "; ".join(self.lines) + f". Tolerance {reference.tolerance:g} relative "
            "to the output scale."
        )


def hubvit_outputs(model, pixel_values, names):
    """The outputs `names` of a HubViTForImageClassification, named as `Reference.forward` names them."""
    outputs = {}
    if "logits" in names:
        outputs["logits"] = model(pixel_values=pixel_values).logits
    if {"pooler_output", "last_hidden_state"} & set(names):
        body = model.hubvit(pixel_values=pixel_values)
        outputs["pooler_output"], outputs["last_hidden_state"] = body.pooler_output, body.last_hidden_state
    return {name: outputs[name] for name in names}


@torch.no_grad()
def verify(reference, model):
    """Run `reference.forward` and the hubvit `model` on the same inputs; `Verification`, None when there is no
    forward, or `ConversionError` listing every output beyond `reference.tolerance` x its scale."""
    if reference.forward is None:
        return None
    config = model.config
    lines, failed, worst = [], [], 0.0
    for size in reference.sizes:
        height, width = size or config.image_size_2d
        pixels = torch.randn(
            reference.batch, config.num_channels, height, width, generator=torch.Generator().manual_seed(0)
        )
        theirs = reference.forward(pixels)
        ours = hubvit_outputs(model, pixels, list(theirs))
        for name, expected in theirs.items():
            expected = torch.as_tensor(np.asarray(expected) if not isinstance(expected, torch.Tensor) else expected)
            diff = (expected.float() - ours[name]).abs().max().item()
            scale = expected.abs().max().item()
            worst = max(worst, diff)
            lines.append(f"{height}x{width} max |Δ{name}| = {diff:.2e} (max |{name}| = {scale:.3g})")
            if not diff <= reference.tolerance * scale:
                failed.append(
                    f"{name} at {height}x{width}: max |difference| {diff:.3g} > {reference.tolerance:g} x {scale:.3g}"
                )
    if failed:
        raise ConversionError(
            f"the converted model does not reproduce {reference.description}; nothing was written.\n"
            + "\n".join(f"    {line}" for line in failed)
        )
    return Verification(worst, lines)
