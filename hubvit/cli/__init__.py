"""The `hubvit` command: its parser derived from the command table (`hubvit.commands`), its output, its errors.

Each subcommand's flags are the fields of its `Options` dataclass, derived by `hubvit.options` as the trainers'
are (positional fields are positional arguments); the parsed values build that `Options` (which checks them) and its
`run` returns a record that this module prints. Bad input (`HubViTError`), a network failure (`NetworkError`) and a file the system refused are one line
and exit status 2; anything else is a bug in hubvit, and its traceback is worth reporting.
"""

import importlib
import json
import logging
import sys

from ..commands import GROUPS, TABLE, TRAINERS
from ..errors import HubViTError
from ..network import NetworkError
from ..options import add_command, build_options, flag_parser, refuse_unknown_flags, subcommands

PUSH_TO_HUB_HELP = "publish the written folder to this Hub repo"
JSON_HELP = "print JSON instead of tables"


def add_extras(parser, command):
    """Flags of the command line alone: where the result goes, not what the function does."""
    if command.words[0] == "convert":
        parser.add_argument(
            "--push-to-hub", "--push_to_hub", dest="push_to_hub", metavar="REPO_ID", help=PUSH_TO_HUB_HELP
        )
    if command.words == ("info",):
        parser.add_argument("--json", action="store_true", help=JSON_HELP)


def build_parser():
    parser = flag_parser(prog="hubvit", description="Convert, export, publish and analyse hubvit checkpoints.")
    commands = subcommands(parser, "command", metavar="COMMAND")
    groups = {}
    for command in TABLE:
        container = commands
        if len(command.words) == 2:
            group = command.words[0]
            if group not in groups:
                container = commands.add_parser(group, dataclass_types=(), allow_abbrev=False, help=GROUPS[group])
                groups[group] = subcommands(container, "subcommand", metavar="KIND")
            container = groups[group]
        options_class, _ = command.load()
        sub = add_command(
            container, command.words[-1], options_class, help=command.help, description=options_class.__doc__
        )
        add_extras(sub, command)
        sub.set_defaults(entry=command, parser=sub)
    for trainer in TRAINERS:
        commands.add_parser(trainer.words[0], dataclass_types=(), add_help=False, help=trainer.help)
    return parser


def parse(parser, argv):
    """Parsed flags; a flag the subcommand does not know is refused with the subcommand's own usage and the flags it
    most resembles (argparse alone reports it with the top-level usage)."""
    args, unknown = parser.parse_known_args(argv)
    refuse_unknown_flags(args.parser if unknown else parser, unknown)
    return args


def options_of(args):
    """The command's `Options` built from the parsed flags (which checks them)."""
    options_class, _ = args.entry.load()
    return build_options(options_class, args)


# ------------------------------------------------------------------------------------------------------ output


def show_conversion(result, args):
    for line in result.lines:
        print(line)
    print(f"wrote {result.folder}")


def show_export(result, args):
    for line in result.notes:
        print(line)
    print("verify: " + "; ".join(result.lines))
    print(f"wrote {result.path}")


def show_push(result, args):
    print(f"pushed {result.folder} to {result.url}")


def show_publish(result, args):
    print(result.table())
    if result.failed:
        causes = "; ".join(f"{outcome.entry.repo_id} ({outcome.detail})" for outcome in result.failed)
        raise HubViTError(f"{len(result.failed)} of {len(result.outcomes)} entries failed: {causes}")


def show_info(result, args):
    from ..analysis import info as counts

    if args.json:
        extra = {"patch_sizes": result.patch_sizes} if result.patch_sizes else {}
        print(json.dumps({**result.summary, **extra}, indent=2))
        return
    print(counts.format_summary(result.summary, args.src))
    if result.patch_sizes:
        print(f"\nBy patch size (attention memory at batch {args.batch_size}, {args.dtype}):")
        print(counts.format_patch_rows(result.patch_sizes))


def show_analysis(result, args):
    values = result.values
    if args.entry.words[1] == "attention-distance":
        means = ", ".join(f"{sum(row) / len(row):.1f}" for row in values["mean_distance"])
        print(f"{values['images']} images; mean attention distance per layer (pixels, mean of heads): {means}")
        print(f"wrote {result.files[0]} and its .json/.csv")
    elif args.entry.words[1] == "position-similarity":
        show_position_similarity(values, result.files)
    else:
        print(f"wrote {result.files[0]}")


def show_position_similarity(values, files):
    def score_text(score):
        return "n/a (grid too small)" if score is None else f"{score:.3f}"

    kind = values["position_embedding_type"]
    if not files:
        print(f"position_embedding_type={kind!r}: this model has no position table to draw")
    if "rotary_stripe_score" in values:
        print(f"wrote {files[0]}; rotary stripe score {score_text(values['rotary_stripe_score'])}")
        files = files[2:]
    if files and "heads" in values:
        print(f"wrote {files[0]} ({values['heads']} heads over (dy, dx))")
    elif files:
        print(f"wrote {files[0]}; stripe score {score_text(values['stripe_score'])}")


SHOW = {
    "ConversionResult": show_conversion,
    "ExportResult": show_export,
    "PushResult": show_push,
    "PublishResult": show_publish,
    "InfoResult": show_info,
    "AnalysisResult": show_analysis,
}


# ------------------------------------------------------------------------------------------------------- errors


def os_error_line(error):
    """One line for an OSError: what went wrong and the path(s) it concerns."""
    text = error.strerror or str(error) or type(error).__name__
    paths = [str(p) for p in (error.filename, error.filename2) if p is not None]
    return f"{text}: {' -> '.join(paths)}" if paths else text


class _Progress(logging.Handler):
    """hubvit's library log records (progress, what was checked) on stderr while a command runs."""

    def emit(self, record):
        try:
            print(record.getMessage(), file=sys.stderr)
        except Exception:  # noqa: BLE001  (a log line must never fail the command)
            self.handleError(record)


def with_progress(function, *args):
    """Run `function(*args)` with hubvit's INFO records shown on stderr, leaving the logging setup as it was."""
    logger = logging.getLogger("hubvit")
    handler, level = _Progress(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        return function(*args)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def run_command(args):
    options = options_of(args)
    _, run = args.entry.load()
    result = run(options)
    SHOW[args.entry.record](result, args)
    if getattr(args, "push_to_hub", None):
        from .. import hub

        pushed = hub.run(hub.Options(str(result.folder), args.push_to_hub))
        show_push(pushed, args)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    for trainer in TRAINERS:  # each its own HfArgumentParser: the options of its script
        if argv[:1] == list(trainer.words):
            script = importlib.import_module(f".{trainer.script}", __package__)
            return script.main(argv[1:], prog=f"hubvit {trainer.name}")
    args = parse(build_parser(), argv)
    from safetensors import SafetensorError

    name = f"hubvit {args.entry.name}"
    try:
        with_progress(run_command, args)
    except (HubViTError, NetworkError) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"{name}: error: {os_error_line(error)}", file=sys.stderr)
        return 2
    except SafetensorError as error:
        print(f"{name}: error: writing or reading safetensors failed: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    return 0


__all__ = ["build_parser", "main"]
