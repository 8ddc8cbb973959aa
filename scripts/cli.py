"""The `hubvit` command: `convert`, `export`, `push`, `publish`, `info`, `analyze`, `train`.

Each source format (and each export) lives in one module of `hubvit.conversion` that offers `add_arguments(parser)`
and `main(args) -> folder`; this file only wires them up. `--push-to-hub REPO_ID` on any conversion publishes the
written folder through `hubvit.conversion.hub`.
"""

import argparse
import importlib
import sys

from hubvit.analysis.commands import add_commands
from hubvit.conversion import hub, publish

CONVERTERS = {
    "timm": ("hubvit.conversion.timm", "a timm checkpoint (Hub-layout folder, weights file or Hub repo id)"),
    "jax": ("hubvit.conversion.jax", "an original JAX .npz (vision_transformer or big_vision), a file or https://"),
    "transformers": ("hubvit.conversion.transformers", "a transformers folder or Hub repo id (ViT, DeiT, DINOv2)"),
    "torchvision": ("hubvit.conversion.torchvision", "a state dict of torchvision's VisionTransformer (vit_b_16 ...)"),
    "pytorch": ("hubvit.conversion.pytorch", "a plain PyTorch ViT on nn.TransformerEncoder (norm_first=True)"),
}
EXPORTERS = {
    "transformers": ("hubvit.conversion.export_transformers", "a folder transformers' built-in ViT loads"),
    "timm": ("hubvit.conversion.export_timm", "a timm Hub-layout folder timm.create_model loads"),
    "onnx": ("hubvit.conversion.export_onnx", "an ONNX graph with dynamic batch, height and width (onnxruntime-verified)"),
}


def add_modules(subparsers, modules):
    """One subcommand per module of `modules` (name -> (module, help)), with the module's arguments and `main`."""
    added = []
    for name, (module_name, help_text) in modules.items():
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(name, help=help_text)
        module.add_arguments(sub)
        sub.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
        sub.set_defaults(run=module.main)
        added.append(sub)
    return added


def build_parser():
    parser = argparse.ArgumentParser(prog="hubvit", description="Convert, export, publish and analyse hubvit checkpoints.")
    commands = parser.add_subparsers(dest="command", required=True)

    convert = commands.add_parser("convert", help="turn another checkpoint format into a hubvit folder")
    for sub in add_modules(convert.add_subparsers(dest="source", required=True), CONVERTERS):
        sub.add_argument("--push-to-hub", metavar="REPO_ID", help="publish the written folder to this Hub repo")
    export = commands.add_parser("export", help="turn a hubvit folder into another library's format")
    add_modules(export.add_subparsers(dest="target", required=True), EXPORTERS)

    push = commands.add_parser("push", help="publish a hubvit folder to the Hub")
    hub.add_arguments(push)
    push.set_defaults(run=hub.main)
    zoo = commands.add_parser("publish", help="convert and push every entry of a manifest (a model zoo)")
    publish.add_arguments(zoo)
    zoo.set_defaults(run=publish.main)

    add_commands(commands)
    commands.add_parser("train", add_help=False, help="fine-tune or train a classifier (`hubvit train --help`)")
    return parser


def os_error_line(error):
    """One line for an OSError: what went wrong and the path(s) it concerns."""
    text = error.strerror or str(error) or type(error).__name__
    paths = [str(p) for p in (error.filename, error.filename2) if p is not None]
    return f"{text}: {' -> '.join(paths)}" if paths else text


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:  # its own HfArgumentParser: the options of scripts/finetune.py
        from hubvit.scripts import finetune

        return finetune.main(argv[1:], prog="hubvit train")
    args = build_parser().parse_args(argv)
    from safetensors import SafetensorError

    from hubvit.conversion.common import ConversionError
    from hubvit.conversion.folder import check_output_path

    try:
        if getattr(args, "out", None) is not None:
            check_output_path(args.out, getattr(args, "src", None), is_file=getattr(args, "out_is_file", False))
        folder = args.run(args)
        if getattr(args, "push_to_hub", None) and folder is not None:
            hub.push_folder(folder, args.push_to_hub)
    except (ConversionError, ValueError) as error:
        print(f"hubvit {args.command}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"hubvit {args.command}: error: {os_error_line(error)}", file=sys.stderr)
        return 2
    except SafetensorError as error:
        print(f"hubvit {args.command}: error: writing or reading safetensors failed: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hubvit {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
