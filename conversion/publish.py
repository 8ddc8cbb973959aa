"""`hubvit publish MANIFEST`: convert and push a zoo of checkpoints, one manifest entry at a time.

A manifest (YAML or CSV) lists entries with `source` (path, Hub repo id or address), `converter` (`timm`,
`transformers`, `jax`), `options` (the converter's keyword arguments, as flags or a mapping), `repo_id` (the target)
and `private`. Each entry calls the converter's Python function (`convert_timm`, ...) directly. Every entry is
tried even when an earlier one failed; a table of results ends the run and the exit status is non-zero if any failed.
An entry is skipped when its target repo's card already records the same source revision (Hub commit, or address
and sha256) and the same hubvit version, so a rerun after a failure only redoes what is missing (`--force` redoes
all). `--dry-run` converts and runs the same load check as a push, and uploads nothing.
"""

import contextlib
import dataclasses
import shlex
import tempfile
import typing
from dataclasses import dataclass, field
from pathlib import Path

import logging

from ..commands import CONVERTERS
from ..errors import HubViTError
from ..limits import load_yaml, read_csv
from ..network import NetworkError, bounded
from ..options import argument, nonempty_path, option, path_text, settle
from ..options import flag as flag_value
from . import sources
from .common import ConversionError

logger = logging.getLogger(__name__)

FIELDS = ("source", "converter", "options", "repo_id", "private")


@dataclass
class Entry:
    source: str
    converter: str
    repo_id: str
    options: list = field(default_factory=list)
    private: bool = False


@dataclass
class Outcome:
    entry: Entry
    result: str
    parity: str = "-"
    commit: str = "-"
    detail: str = ""


@dataclass(frozen=True)
class PublishResult:
    """One `Outcome` per manifest entry (result pushed, skipped, checked or failed; parity figure; repo commit)."""

    outcomes: tuple

    @property
    def failed(self) -> list:
        return [outcome for outcome in self.outcomes if outcome.result == "failed"]

    def table(self) -> str:
        return summary(self.outcomes)


@dataclass(frozen=True)
class Options:
    """Convert and push every entry of a YAML or CSV manifest (a model zoo), each through its converter's function;
    an entry whose repo card already records the same source revision and hubvit version is skipped (`force` redoes
    it), `dry_run` converts and load-checks without uploading. A failed entry does not stop the others: the
    result lists every outcome (see `PublishResult.failed`)."""

    manifest: str = argument("MANIFEST", "YAML or CSV of source, converter, options, repo_id, private")
    dry_run: bool = option(False, "convert and check every entry, push nothing")
    force: bool = option(False, "convert and push even where the card says it is current")
    work_dir: str | None = option(None, "keep the converted folders here (default: a temporary one)", metavar="DIR")

    def __post_init__(self):
        settle(
            self,
            manifest=nonempty_path(self.manifest, "manifest"),
            dry_run=flag_value(self.dry_run, "dry_run"),
            force=flag_value(self.force, "force"),
            work_dir=None if self.work_dir is None else path_text(self.work_dir, "work_dir"),
        )


def run(options: Options) -> PublishResult:
    outcomes = publish_all(options.manifest, options.dry_run, options.force, options.work_dir)
    return PublishResult(tuple(outcomes))


def publish_all(manifest, dry_run=False, force=False, work_dir=None):
    """The `Outcome` of every entry of the manifest, each tried even when an earlier one failed."""
    entries = read_manifest(manifest)
    with tempfile.TemporaryDirectory(prefix="hubvit-publish-") as scratch:
        work = Path(work_dir or scratch).resolve()
        return [publish_entry(entry, work, dry_run=dry_run, force=force) for entry in entries]


# ---------------------------------------------------------------------------------------------------- manifest


def read_manifest(path):
    """The entries of a YAML (a list, or a mapping with `entries`) or CSV (header row) manifest, all validated."""
    path = Path(path)
    if path.is_dir():
        raise ConversionError(f"{path}: a folder, not a manifest file (.yaml, .yml or .csv)")
    if not path.is_file():
        raise ConversionError(f"{path}: no such manifest")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConversionError(
            f"{path}: byte {error.start} is not UTF-8 ({error.object[error.start : error.start + 1]!r}); save the "
            "manifest as UTF-8"
        ) from None
    if path.suffix.lower() == ".csv":
        rows = read_csv(text, str(path))
    elif path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            rows = load_yaml(text, str(path))
        except yaml.YAMLError as error:
            raise ConversionError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
        if isinstance(rows, dict) and "entries" in rows:
            rows = rows["entries"]
    else:
        raise ConversionError(f"{path}: expected a .yaml, .yml or .csv manifest")
    if not isinstance(rows, list) or not rows:
        raise ConversionError(f"{path}: expected a non-empty list of entries ({', '.join(FIELDS)})")
    entries = [entry_of(row, f"{path} entry {number}", path.parent) for number, row in enumerate(rows, 1)]
    targets = [e.repo_id for e in entries]
    duplicates = sorted({t for t in targets if targets.count(t) > 1})
    if duplicates:
        raise ConversionError(f"{path}: several entries push to {', '.join(duplicates)}")
    return entries


def entry_of(row, where, base):
    """An `Entry`; a relative local source is taken relative to the manifest's folder."""
    if not isinstance(row, dict):
        raise ConversionError(f"{where}: expected a mapping with {', '.join(FIELDS)}, got {row!r}")
    unknown = sorted(set(row) - set(FIELDS))
    missing = [name for name in ("source", "converter", "repo_id") if not str(row.get(name) or "").strip()]
    if unknown or missing:
        raise ConversionError(
            f"{where}: "
            + "; ".join(
                ([f"unknown fields {unknown}"] if unknown else []) + ([f"missing {missing}"] if missing else [])
            )
            + f" (fields: {', '.join(FIELDS)})"
        )
    converter = str(row["converter"]).strip()
    if converter not in CONVERTERS:
        raise ConversionError(f"{where}: converter {converter!r}; expected one of {sorted(CONVERTERS)}")
    source = str(row["source"]).strip()
    if (base / source).exists() and not Path(source).is_absolute():
        source = str((base / source).resolve())
    return Entry(
        source=source,
        converter=converter,
        repo_id=str(row["repo_id"]).strip(),
        options=option_list(row.get("options"), where),
        private=flag(row.get("private"), where),
    )


def option_list(value, where):
    """Converter flags from a string (shell words), a list, or a mapping {flag: value} (true: a bare flag)."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, dict):
        words = []
        for name, setting in value.items():
            flag_name = "--" + str(name).removeprefix("--").replace("_", "-")
            if setting is True:
                words.append(flag_name)
            elif setting is not False and setting is not None:
                words += [flag_name, str(setting)]
        return words
    raise ConversionError(f"{where}: options {value!r}; expected a string of flags, a list or a mapping")


def flag(value, where):
    if isinstance(value, bool):
        return value
    text = str(value or "").strip().lower()
    if text in ("", "false", "no", "0", "public"):
        return False
    if text in ("true", "yes", "1", "private"):
        return True
    raise ConversionError(f"{where}: private {value!r}; expected true/false (or private/public)")


# ---------------------------------------------------------------------------------------------------- one entry


def publish_entry(entry, work, dry_run=False, force=False):
    """Convert, check and push one entry; every failure becomes a failed `Outcome`, never an exception."""
    logger.info("== %s: %s %s", entry.repo_id, entry.converter, entry.source)
    try:
        name = entry.repo_id.replace("/", "--")
        options_class, convert = CONVERTERS[entry.converter].load()
        options = keyword_arguments(entry.options, CONVERTERS[entry.converter], f"{entry.repo_id} options")
        source = current_source(entry, options)
        if not force and source:
            published = published_record(entry.repo_id)
            if published == {"version": hubvit_version(), "source": source}:
                return Outcome(entry, "skipped", detail="the card records this source revision and hubvit version")
        from ..folder import check_output_path

        check_output_path(work / name, entry.source)
        work.mkdir(parents=True, exist_ok=True)
        with contextlib.chdir(work):  # the card's command names OUT as given: the same card on every run
            result = convert(options_class(entry.source, name, overwrite=True, **options))
        folder = work / result.folder
        parity = "n/a" if result.max_abs_diff is None else f"{result.max_abs_diff:.2e}"
        from ..hub import check_files, check_loads, push_folder

        if dry_run:
            check_files(folder)
            check_loads(folder)
            return Outcome(entry, "checked", parity, detail=str(folder))
        info = push_folder(
            folder,
            entry.repo_id,
            private=entry.private,
            commit_message=f"hubvit {hubvit_version()}: {entry.converter} {entry.source}",
        )
        return Outcome(entry, "pushed", parity, info.oid or "-")
    except Exception as error:  # noqa: BLE001  (one entry's failure must not stop the others)
        return failed(entry, str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)


def failed(entry, detail):
    logger.info("%s: failed: %s", entry.repo_id, detail)
    return Outcome(entry, "failed", detail=detail)


def keyword_arguments(words, command, where):
    """The options of a converter's `Options` (`command`: its entry in the command table) that converter flags name
    (`--tolerance 1e-5`, `--model-args=TEXT`, `--no-verify`), each typed by its annotation; `HubViTError` naming an
    unknown flag or a bad value."""
    options_class, _ = command.load()
    hints = typing.get_type_hints(options_class)
    names = [field.name for field in dataclasses.fields(options_class) if field.kw_only and field.name != "overwrite"]
    flags = ", ".join("--" + name.replace("_", "-") for name in names)
    words, kwargs = list(words), {}
    while words:
        word = words.pop(0)
        text, has_value, value = word.removeprefix("--").partition("=")
        name = text.replace("-", "_")
        negated = name.startswith("no_") and hints.get(name[3:]) is bool and not has_value
        name = name[3:] if negated else name
        if not word.startswith("--") or name not in names:
            raise HubViTError(f"{where}: {word!r} is not an option of {command.function}; expected {flags}")
        if hints[name] is bool and not has_value:
            kwargs[name] = not negated
            continue
        if not has_value:
            if not words:
                raise HubViTError(f"{where}: --{text} needs a value")
            value = words.pop(0)
        kwargs[name] = typed(value, hints[name], f"{where}: --{text}")
    return kwargs


def typed(text, hint, where):
    """`text` as the int, float or bool `hint` asks for (text otherwise)."""
    kinds = set(typing.get_args(hint) or (hint,)) - {type(None)}
    if str in kinds:  # the function parses its own text (`patch_size`: '16' or '16x8')
        return text
    try:
        if bool in kinds:
            return {"true": True, "false": False}[text.lower()]
        if int in kinds:
            return int(text)
        if float in kinds:
            return float(text)
    except (KeyError, ValueError):
        expected = " or ".join(sorted(kind.__name__ for kind in kinds))
        raise HubViTError(f"{where} {text!r}; expected {expected}") from None
    return text


def current_source(entry, options):
    """What the card of this entry's conversion will record as its source, found without converting ({} if local)."""
    fields = {field.name for field in dataclasses.fields(CONVERTERS[entry.converter].load()[0])}
    if Path(entry.source).exists():
        return {}
    if "sha256" in fields:
        return sources.resolve(entry.source, "url", sha256=options.get("sha256")).record()
    from huggingface_hub import HfApi

    repo_id = sources.REPO_ID.fullmatch(entry.source)
    if "revision" not in fields or not repo_id:
        return {}
    try:
        with bounded(f"model_info of {repo_id[1]}"):
            commit = HfApi().model_info(repo_id[1], revision=options.get("revision")).sha
    except NetworkError:
        raise
    except Exception:  # noqa: BLE001  (the conversion reports the real error)
        return {}
    return {"repo_id": repo_id[1], "revision": commit}


def published_record(repo_id):
    """The `hubvit` metadata of the card now in `repo_id`, or {} when there is no such repo or card."""
    from huggingface_hub import ModelCard, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError

    try:
        with bounded(f"download of {repo_id}/README.md"):
            path = hf_hub_download(repo_id, "README.md")
    except (EntryNotFoundError, RepositoryNotFoundError, HfHubHTTPError, OSError):
        return {}
    record = ModelCard.load(path).data.to_dict().get("hubvit") or {}
    return {"version": record.get("version"), "source": record.get("source")}


def hubvit_version():
    from .. import __version__

    return __version__


def summary(outcomes):
    """A Markdown table: entry, result, parity figure (max |difference| from the source), repo commit."""
    rows = [("entry", "result", "parity", "repo commit")]
    rows += [
        (o.entry.repo_id, o.result + (f" ({o.detail})" if o.result == "failed" else ""), o.parity, o.commit)
        for o in outcomes
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "| " + " | ".join("-" * width for width in widths) + " |")
    return "\n".join(lines)
