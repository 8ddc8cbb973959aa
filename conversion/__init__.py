"""Conversion of other ViT checkpoints into hubvit folders, and the one writer of those folders.

A source format is one module here, of one shape (`jax`, `timm`, `transformers`, `torchvision`, `pytorch`):

- `add_arguments(parser)`: SRC, OUT, its own flags, `common.add_verify_arguments` (`--verify`, `--tolerance`) and
  `sources.add_arguments` (`--revision` of a Hub repo id SRC, or `--sha256` of an https:// one);
- `convert(args) -> common.Conversion`: find SRC (`sources.resolve(args)`: a local path, a download, and the
  `source` record of where it came from for the card), read it safely (`common.read_weights`), translate names
  and layouts through `common.StrictMapping` (`map`/`combine` what exists, `drop` with a reason what is discarded,
  `create` with a reason what the source lacks), and describe the source: config fields, `Preprocessing` (its
  evaluation transform; `preprocessing.processor_for` builds the folder's image processor from it), labels, and a
  `Reference` whose `forward` runs the SOURCE implementation on the same weights (`Reference.unavailable(reason)`
  when it cannot run);
- `main(args)`: `folder.write_conversion(convert(args), args.out, overwrite=args.overwrite)`, which builds the
  model, runs `common.verify` against the reference, and writes the folder with the measured figure in its card.

Register the module in `scripts/cli.py` (`CONVERTERS`). Exports (`export_transformers`, `export_timm`) go the other way and offer
`add_arguments`/`main` too.
"""
