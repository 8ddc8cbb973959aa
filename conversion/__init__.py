"""Conversion of other ViT checkpoints into hubvit folders, and the one writer of those folders.

The Python functions users call (`convert_timm`, `convert_jax`, ..., `export_*`, `push`, `publish`) are in `api`,
re-exported by `hubvit`. A source format is one module here, of one shape (`jax`, `timm`, `transformers`,
`torchvision`, `pytorch`; `jax` reads its two archive layouts through `jax_layout`):

- `add_arguments(parser)`: SRC, OUT, its own flags, `arguments.add_verify_arguments` (`--verify`, `--tolerance`, `--patch-size`) and
  `sources.add_arguments` (`--revision` of a Hub repo id SRC, or `--sha256` of an https:// one); each flag's
  destination is the name of a keyword argument of the module's function in `api`;
- `Options`: those keyword arguments, checked, as a frozen record;
- `convert(options) -> common.Conversion`: find SRC (`sources.resolve`: a local path, a download, and the `source`
  record of where it came from for the card), read it safely (`weights.read_weights`), translate names and layouts
  through `mapping.StrictMapping` (`map`/`combine` what exists, `drop` with a reason what is discarded, `create` with
  a reason what the source lacks), and describe the source: config fields, `Preprocessing` (its evaluation
  transform; `preprocessing.processor_for` builds the folder's image processor from it), labels, and a `Reference`
  whose `forward` runs the SOURCE implementation on the same weights (`Reference.unavailable(reason)` when it cannot
  run).

`api.convert_<format>` checks its keyword arguments into `Options` and calls `folder.write_conversion(convert(options),
out)`, which builds the model, runs `verification.verify` against the reference, writes the folder with the measured
figure in its card and returns a `common.ConversionResult`. Register a new module in `api` and in `scripts/cli.py`
(`CONVERTERS`). Exports (`export_transformers`, `export_timm`, `export_onnx`) go the other way: `add_arguments`,
`Options`, `export(options) -> common.ExportResult`, reading the hubvit folder with `from_pretrained`.
"""
