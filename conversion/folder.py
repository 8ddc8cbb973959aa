"""A converter's command: OUT checked, SRC converted, the result verified against the source and written."""

import logging

from ..folder import build_model, check_output_path, write_folder
from ..errors import OutputExistsError
from ..card import CardInfo
from ..preprocessing import processor_for
from .common import ConversionResult, make_config, verify
from .patch_size import patch_size_text, resize_converted

logger = logging.getLogger(__name__)


def run_conversion(convert, options):
    """A converter's command: check OUT before reading anything (an existing non-empty OUT without `overwrite` is
    refused before a long conversion), convert SRC with `convert(options)`, verify and write the folder."""
    out = check_output_path(options.out, options.src)
    if out.is_dir() and not options.overwrite and any(out.iterdir()):
        raise OutputExistsError(f"{out} exists and is not empty; pass overwrite=True (--overwrite) to replace it")
    return write_conversion(convert(options), options.out, overwrite=options.overwrite, patch_size=options.patch_size)


def write_conversion(conversion, out_dir, overwrite=False, patch_size=None):
    """Build the model of a converter's `Conversion`, verify it against the source, and write the folder; returns the
    `ConversionResult` (the folder, the measured figure and what the conversion has to say).

    The card's Verification section carries the figure measured here, on these weights; where the conversion has
    no reference forward, the card says the file was not verified and why. `patch_size`: after the verification, the
    model is PI-resized to that patch size (`patch_size.resize_converted`) and the card's provenance says so.
    """
    config = make_config(conversion)
    model = build_model(config, conversion.weights)
    lines = [*conversion.notes, *conversion.dropped, *conversion.preprocessing.notes]
    reference = conversion.reference
    result = verify(reference, model)
    if result is None:
        verification = f"This file was not verified at conversion: {reference.reason}."
        lines.append(f"not verified: {reference.reason}")
    else:
        verification = result.text(reference)
        lines.append("verify: " + "; ".join(result.lines))
    notes = " ".join(note if note.endswith(".") else f"{note}." for note in conversion.preprocessing.notes)
    resized = None if patch_size is None else resize_converted(model, patch_size, conversion.preprocessing.resample)
    card = CardInfo(
        provenance="\n\n".join(text for text in (conversion.provenance, notes, resized) if text),
        command=conversion.command + ("" if patch_size is None else f" --patch-size {patch_size_text(patch_size)}"),
        family=conversion.family,
        verification=verification,
        max_abs_diff=result.max_abs_diff if result else None,
        dropped=[line for line in conversion.dropped if not line.startswith("mapped ")],
        license=conversion.license,
        citation_key=conversion.citation_key,
        title=conversion.title,
        source=conversion.source,
    )
    processor = processor_for(conversion.preprocessing, config)
    out = write_folder(model, out_dir, processor, card, overwrite=overwrite)
    logger.info("wrote %s", out)
    return ConversionResult(out, result.max_abs_diff if result else None, verification, tuple(lines))
