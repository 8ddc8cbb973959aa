"""The `hubvit` command: `convert`, `export`, `push`, `publish`, `info`, `analyze`, `train`.

Every subcommand is a Python function of `hubvit` (`hubvit.convert_timm`, `hubvit.export_onnx`, `hubvit.push`, ...):
this file builds the flags (each module's `add_arguments`), hands them to the function as keyword arguments of the
same names, and prints what comes back or the error. `--push-to-hub REPO_ID` on any conversion pushes the written
folder with `hubvit.push`.
"""

import argparse
import importlib
import sys

from hubvit.analysis.commands import add_commands
from hubvit.conversion import api, hub, publish

# name -> (module with add_arguments, its function in hubvit.conversion.api, help)
CONVERTERS = {
    "timm": (
        "hubvit.conversion.timm",
        "convert_timm",
        "a timm checkpoint (Hub-layout folder, weights file or Hub repo id)",
    ),
    "jax": (
        "hubvit.conversion.jax",
        "convert_jax",
        "an original JAX .npz (vision_transformer or big_vision), a file or https://",
    ),
    "transformers": (
        "hubvit.conversion.transformers",
        "convert_transformers",
        "a transformers folder or Hub repo id (ViT, DeiT, DINOv2)",
    ),
    "torchvision": (
        "hubvit.conversion.torchvision",
        "convert_torchvision",
        "a state dict of torchvision's VisionTransformer (vit_b_16 ...)",
    ),
    "pytorch": (
        "hubvit.conversion.pytorch",
        "convert_pytorch",
        "a plain PyTorch ViT on nn.TransformerEncoder (norm_first=True)",
    ),
}
EXPORTERS = {
    "transformers": (
        "hubvit.conversion.export_transformers",
        "export_transformers",
        "a folder transformers' built-in ViT loads",
    ),
    "timm": ("hubvit.conversion.export_timm", "export_timm", "a timm Hub-layout folder timm.create_model loads"),
    "onnx": (
        "hubvit.conversion.export_onnx",
        "export_onnx",
        "an ONNX graph with dynamic batch, height and width (onnxruntime-verified)",
    ),
}
# Destinations that steer the command line itself rather than name a keyword argument of the function.
CLI_ONLY = {"command", "source", "target", "analysis", "run", "show", "push_to_hub", "out_is_file", "json"}


def show_nothing(result, args):
    """The functions of convert/export/push print their own progress and the path they wrote."""


def show_publish(result, args):
    print(result.table())
    if result.failed:
        names = ", ".join(outcome.entry.repo_id for outcome in result.failed)
        raise api.HubViTError(f"{len(result.failed)} of {len(result.outcomes)} entries failed: {names}")


def add_modules(subparsers, modules):
    """One subcommand per module of `modules` (name -> (module, function, help)), with the module's flags."""
    added = []
    for name, (module_name, function, help_text) in modules.items():
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(name, help=help_text)
        module.add_arguments(sub)
        sub.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
        sub.set_defaults(run=getattr(api, function), show=show_nothing)
        added.append(sub)
    return added


def build_parser():
    parser = argparse.ArgumentParser(
        prog="hubvit", description="Convert, export, publish and analyse hubvit checkpoints."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    convert = commands.add_parser("convert", help="turn another checkpoint format into a hubvit folder")
    for sub in add_modules(convert.add_subparsers(dest="source", required=True), CONVERTERS):
        sub.add_argument("--push-to-hub", metavar="REPO_ID", help="publish the written folder to this Hub repo")
    export = commands.add_parser("export", help="turn a hubvit folder into another library's format")
    add_modules(export.add_subparsers(dest="target", required=True), EXPORTERS)

    push = commands.add_parser("push", help="publish a hubvit folder to the Hub")
    hub.add_arguments(push)
    push.set_defaults(run=api.push, show=show_nothing)
    zoo = commands.add_parser("publish", help="convert and push every entry of a manifest (a model zoo)")
    publish.add_arguments(zoo)
    zoo.set_defaults(run=api.publish, show=show_publish)

    add_commands(commands)
    commands.add_parser("train", add_help=False, help="fine-tune or train a classifier (`hubvit train --help`)")
    return parser


def keyword_arguments(args):
    """The parsed flags as the function's keyword arguments (argparse destinations are named after them)."""
    return {name: value for name, value in vars(args).items() if name not in CLI_ONLY}


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

    try:
        result = args.run(**keyword_arguments(args))
        args.show(result, args)
        if getattr(args, "push_to_hub", None):
            api.push(result.folder, args.push_to_hub)
    except ValueError as error:
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
