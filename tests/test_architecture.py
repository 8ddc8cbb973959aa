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
        if COMMAND_LINE not in path.parents
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
