"""The `hubvit` command: `convert`, `export`, `push`, `publish`.

Each source format lives in one module of `hubvit.conversion` that offers `add_arguments(parser)` and
`main(args) -> folder`; this file only wires them up. `--push-to-hub REPO_ID` on any conversion publishes the
written folder through `hubvit.conversion.hub`.
"""

import argparse
import importlib
import sys

CONVERTERS = {
    "timm": ("hubvit.conversion.timm", "a timm checkpoint (Hub-layout folder or weights file)"),
    "jax": ("hubvit.conversion.jax", "an original JAX .npz (vision_transformer or big_vision)"),
    "transformers": ("hubvit.conversion.transformers", "a folder saved by transformers (ViT, DeiT, DINOv2)"),
}
EXPORTERS = {
    "transformers": ("hubvit.conversion.transformers", "a folder transformers' built-in ViT loads"),
}


def _module(name):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name == name:
            return None
        raise


def build_parser():
    parser = argparse.ArgumentParser(prog="hubvit", description="Convert, export and publish hubvit checkpoints.")
    commands = parser.add_subparsers(dest="command", required=True)

    convert = commands.add_parser("convert", help="turn another checkpoint format into a hubvit folder")
    sources = convert.add_subparsers(dest="source", required=True)
    for source, (module_name, help_text) in CONVERTERS.items():
        module = _module(module_name)
        if module is None:
            continue
        sub = sources.add_parser(source, help=help_text)
        module.add_arguments(sub)
        sub.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
        sub.add_argument("--push-to-hub", metavar="REPO_ID", help="publish the written folder to this Hub repo")
        sub.set_defaults(run=module.main)

    export = commands.add_parser("export", help="turn a hubvit folder into another library's format")
    targets = export.add_subparsers(dest="target", required=True)
    for target, (module_name, help_text) in EXPORTERS.items():
        module = _module(module_name)
        if module is None or not hasattr(module, "add_export_arguments"):
            continue
        sub = targets.add_parser(target, help=help_text)
        module.add_export_arguments(sub)
        sub.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
        sub.set_defaults(run=module.export_main)

    hub = _module("hubvit.conversion.hub")
    if hub is not None:
        push = commands.add_parser("push", help="publish a hubvit folder to the Hub")
        hub.add_arguments(push)
        push.set_defaults(run=hub.main)
    publish = _module("hubvit.conversion.publish")
    if publish is not None:
        sub = commands.add_parser("publish", help="convert and push every entry of a manifest (a model zoo)")
        publish.add_arguments(sub)
        sub.set_defaults(run=publish.main)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    from hubvit.conversion.common import ConversionError

    try:
        folder = args.run(args)
        if getattr(args, "push_to_hub", None) and folder is not None:
            from hubvit.conversion.hub import push_folder

            push_folder(folder, args.push_to_hub)
    except (ConversionError, FileExistsError, FileNotFoundError, ValueError) as error:
        print(f"hubvit {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
