"""Conversion of other ViT checkpoints into hubvit folders, the exports back, and publishing.

A source format is one module here (`jax`, `timm`, `transformers`, `torchvision`, `pytorch`; `jax` reads its two
archive layouts through `jax_layout`) and one line in the command table (`hubvit.commands`), of one shape:

- `Options(common.ConversionOptions)`: a frozen, typed dataclass of its own options (help text in each field's
  metadata, checks in `__post_init__`) on top of the shared SRC, OUT, `overwrite`, `verify`, `tolerance` and
  `patch_size`. It is the only place a flag is declared: `hubvit.convert_<format>(...)`, `hubvit convert <format>`
  and the options a `publish` manifest may give are derived from it;
- `convert(options) -> common.Conversion`: find SRC (`sources.resolve`: a local path, a download, and the `source`
  record of where it came from for the card), read it safely (`weights.read_weights`), translate names and layouts
  through `mapping.StrictMapping` (`map`/`combine` what exists, `drop` with a reason what is discarded, `create` with
  a reason what the source lacks), and describe the source: config fields, `Preprocessing` (its evaluation
  transform; `preprocessing.processor_for` builds the folder's image processor from it), labels, and a `Reference`
  whose `forward` runs the SOURCE implementation on the same weights (`Reference.unavailable(reason)` when it cannot
  run);
- `run(options) = folder.run_conversion(convert, options)`: OUT checked first, then the conversion, then
  `folder.write_conversion`, which builds the model, runs `verification.verify` against the reference, writes the
  folder with the measured figure in its card and returns a `common.ConversionResult`.

Exports (`export_transformers`, `export_timm`, `export_onnx`) go the other way: `Options(common.ExportOptions)` and
`run(options) -> common.ExportResult`, reading the hubvit folder strictly. `hub` (`push`) and `publish` have the same
shape. Nothing here prints: progress goes to module loggers, results to the returned records.
"""
