"""The tables of measured figures in README.md and docs/ are what scripts/render_docs.py makes of the committed JSON."""

import json
import shutil
from pathlib import Path

import pytest

from scripts import render_docs

ROOT = Path(__file__).resolve().parents[1]


def test_committed_docs_are_rendered_from_the_committed_json():
    stale = [str(path.relative_to(ROOT)) for path in render_docs.stale(ROOT)]
    assert stale == [], f"run `python scripts/render_docs.py`: out of date: {stale}"


def test_every_registered_table_appears_in_some_document():
    text = "".join(path.read_text(encoding="utf-8") for path in render_docs.documents(ROOT))
    missing = [name for name in render_docs.TABLES if f"<!-- begin: {name} -->" not in text]
    assert missing == []


@pytest.fixture
def copy_of_repository(tmp_path):
    """README.md, docs/, benchmarks/README.md and the JSON they render from, copied so a test can change a result."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    shutil.copy(ROOT / "benchmarks" / "README.md", tmp_path / "benchmarks" / "README.md")
    return tmp_path


def test_a_changed_result_makes_the_check_fail_until_rendered(copy_of_repository, capsys):
    results = copy_of_repository / render_docs.MAIN_COMMAND_RESULTS
    data = json.loads(results.read_text())
    data["eval_accuracy"] = 0.5
    results.write_text(json.dumps(data))

    assert render_docs.main(["--check", "--root", str(copy_of_repository)]) == 1
    assert "docs/fine-tuning.md: out of date" in capsys.readouterr().out

    assert render_docs.main(["--root", str(copy_of_repository)]) == 0
    assert render_docs.main(["--check", "--root", str(copy_of_repository)]) == 0
    rendered = (copy_of_repository / "docs" / "fine-tuning.md").read_text()
    assert "| eval accuracy | 0.5000 (375 of 750 held-out digits) |" in rendered


def test_rendering_rewrites_only_the_marked_region():
    text = "before\n<!-- begin: main-command -->\nold table\n<!-- end: main-command -->\nafter\n"
    rendered = render_docs.render(text, ROOT)
    assert rendered.startswith("before\n<!-- begin: main-command -->\n| figure |")
    assert rendered.endswith("\n<!-- end: main-command -->\nafter\n")
    assert "old table" not in rendered
    assert render_docs.render(rendered, ROOT) == rendered


def test_an_unknown_table_is_refused_by_name():
    with pytest.raises(render_docs.RenderError, match="unknown table 'no-such-table'"):
        render_docs.render("<!-- begin: no-such-table -->\n<!-- end: no-such-table -->\n", ROOT)


def test_an_unclosed_region_is_refused_by_name():
    with pytest.raises(render_docs.RenderError, match="'main-command' has no matching begin/end pair"):
        render_docs.render("<!-- begin: main-command -->\nno end\n", ROOT)


def test_a_missing_result_file_is_named(tmp_path):
    with pytest.raises(render_docs.RenderError, match="docs/analysis/mnist_all_results.json: no such file"):
        render_docs.render("<!-- begin: main-command -->\n<!-- end: main-command -->\n", tmp_path)


def test_experiment_times_add_up_the_campaign_units_training_minutes():
    records = [json.loads(p.read_text()) for p in (ROOT / "docs/experiments/runs/attention_distance").glob("*.json")]
    row = next(line for line in render_docs.experiment_times(ROOT).splitlines() if "attention_distance.md" in line)
    total = sum(r["minutes"] for r in records)
    assert f"{total:.1f} min of training in {len(records)} units" in row
