"""The floor plan of the package, checked from its source: no module imports the command line, flags are declared only
in the options dataclasses, and no two modules import each other, directly or through others (an import inside a
function counts: it is a dependency all the same)."""

import ast
import re
from pathlib import Path

import pytest

import hubvit

ROOT = Path(__file__).resolve().parents[1]
# hubvit's subpackages: its own folders, and the user's top-level folders setup.py's package_dir maps into it
PACKAGES = {
    "hubvit": "hubvit",
    "hubvit.cli": "hubvit/cli",
    "hubvit.modeling": "modeling",
    "hubvit.conversion": "conversion",
    "hubvit.analysis": "hubvit/analysis",
    "hubvit.training": "hubvit/training",
}
LIBRARY = ("conversion", "hubvit/analysis", "hubvit/training", "hubvit")
COMMAND_LINE = ROOT / "hubvit" / "cli"
OPTIONS = ROOT / "hubvit" / "options.py"


def modules():
    """{dotted name: path} of every module of the library packages."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
    return found


def imports(name, path, known):
    """The hubvit modules `name` imports anywhere in its source."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {target for target in targets if target in known and target != name}
    return found


def cycles(graph):
    """Every strongly connected group of more than one module (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return groups


def test_no_two_modules_import_each_other():
    known = modules()
    # a package's __init__ importing its own modules is how a package exposes them, not a circle of dependencies
    graph = {
        name: {t for t in imports(name, path, known) if not (path.stem == "__init__" and t.startswith(name + "."))}
        for name, path in known.items()
    }
    assert cycles(graph) == []


@pytest.mark.parametrize("folder", LIBRARY)
def test_flags_are_declared_only_in_options_dataclasses(folder):
    calls = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        if COMMAND_LINE not in path.parents and path != OPTIONS
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\badd_argument\(", line)
    ]
    assert calls == []


def test_the_library_never_imports_the_command_line():
    known = modules()
    importers = [name for name, path in known.items() if "hubvit.cli" in imports(name, path, known)]
    assert [name for name in importers if not name.startswith("hubvit.cli")] == []


def test_training_reads_folders_through_the_folder_layer_not_conversion_or_analysis():
    known = modules()
    reached = {
        target
        for name, path in known.items()
        if name.startswith("hubvit.training")
        for target in imports(name, path, known)
    }
    assert sorted(t for t in reached if t.startswith(("hubvit.conversion", "hubvit.analysis"))) == []


def test_hubvit_is_the_package_these_folders_install():
    assert Path(hubvit.__file__).resolve().parent == ROOT / "hubvit"


def test_the_library_imports_its_own_modules_relatively():
    """One import style inside the package: `from ..errors import ...`; `hubvit.` by name only in scripts and tests."""
    absolute = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in modules().values()
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "hubvit")
        or (isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "hubvit" for alias in node.names))
    ]
    assert absolute == []


def test_one_library_file_computes_the_gradients_of_every_trainer():
    """Classification and segmentation train through the one loop: `accelerator.backward` is called in one place."""
    calling = [
        path.relative_to(ROOT).as_posix() for path in modules().values() if "accelerator.backward(" in path.read_text()
    ]
    assert calling == ["hubvit/training/loop.py"]


def test_segmentation_options_are_the_shared_ones_plus_its_own():
    """Each trainer's option groups derive from the shared ones; a trainer redeclares a shared option only to give
    it another default."""
    import dataclasses

    from hubvit.training import arguments, segmentation_arguments

    shared = (arguments.SharedDataArguments, arguments.SharedModelArguments, arguments.SharedTrainingArguments)
    for groups in (arguments.GROUPS, segmentation_arguments.GROUPS):
        assert [issubclass(group, base) for group, base in zip(groups, shared)] == [True] * 3
        for group, base in zip(groups, shared):
            defaults = {f.name: f.default for f in dataclasses.fields(base)}
            redeclared = [name for name in group.__annotations__ if name in defaults]
            same = [name for name in redeclared if getattr(group, name, None) == defaults[name]]
            assert same == [], f"{group.__name__} repeats {same} with the shared default"


def test_one_module_derives_every_flag_from_dataclasses():
    """Commands and trainers alike get their flags from `hubvit.options` (transformers' `HfArgumentParser` over
    typed dataclasses): no other library file builds a parser of its own."""
    building = [
        path.relative_to(ROOT).as_posix()
        for path in modules().values()
        if re.search(r"HfArgumentParser\(|ArgumentParser\(|parse_args_into_dataclasses", path.read_text())
    ]
    assert building == ["hubvit/options.py"]


def test_a_command_and_a_trainer_parse_flags_the_same_way():
    """Both spellings and the boolean forms of `HfArgumentParser`, in `hubvit convert timm` as in `hubvit train`."""
    from transformers import HfArgumentParser

    from hubvit.cli import build_parser
    from hubvit.training import arguments

    top = build_parser()
    convert = top.parse_args(["convert", "timm", "src", "out", "--no-verify", "--patch-size", "8", "--overwrite"])
    assert (convert.verify, convert.patch_size, convert.overwrite) == (False, "8", True)
    assert isinstance(convert.parser, HfArgumentParser)
    train = arguments.parse_args(
        ["--output-dir", "o", "--trust-remote-code", "false", "--image_size", "32", "--streaming"]
    )
    assert (train.output_dir, train.trust_remote_code, train.image_size, train.streaming) == ("o", False, 32, True)
    assert isinstance(arguments.parser(), HfArgumentParser)


@pytest.mark.parametrize(
    "argv",
    [
        ["hubvit", "convert", "timm", "src", "out", "--toleranse", "1e-4"],
        ["hubvit", "train", "--output_dir", "o", "--learning_rat", "1e-3"],
        ["hubvit", "train-segmentation", "--output_dir", "o", "--num_train_epoch", "2"],
    ],
)
def test_a_misspelt_flag_gets_the_same_refusal_everywhere(argv, capsys):
    from hubvit.cli import main

    with pytest.raises(SystemExit) as stop:
        main(argv[1:])
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert "unrecognized arguments" in error and "did you mean --" in error


@pytest.mark.parametrize(
    "build",
    [
        lambda: __import__("hubvit").training.arguments.Arguments.build(output_dir="o", learning_rat=1e-3),
        lambda: __import__("hubvit").training.segmentation_arguments.SegmentationArguments.build(output_dir="o", x=1),
    ],
    ids=["classification", "segmentation"],
)
def test_an_unknown_option_is_one_error_type_in_every_trainer(build):
    from hubvit.errors import HubViTError, UsageError

    with pytest.raises(UsageError, match="unknown option") as error:
        build()
    assert isinstance(error.value, HubViTError)


def test_a_bad_segmentation_value_is_the_same_error_type_as_a_bad_classification_value():
    from hubvit.errors import UsageError
    from hubvit.training.segmentation_arguments import SegmentationArguments, check_options

    with pytest.raises(UsageError, match="--num_train_epochs 0: expected a positive number"):
        check_options(SegmentationArguments.build(output_dir="o", num_train_epochs=0))
