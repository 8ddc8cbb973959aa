"""Walk timm's pretrained tags of its ViT-family modules, convert each architecture and record parity or the refusal.

    python scripts/timm_coverage.py --json docs/analysis/timm_coverage.json   # resumable: recorded tags are skipped
    python scripts/timm_coverage.py --json docs/analysis/timm_coverage.json --again refused crashed
    python scripts/render_docs.py                                              # the table in docs/conversion.md

Each tag is built by timm as the tag defines it (its `num_classes`, image and patch size, every model argument)
except `depth=1`, with timm's own random initialisation; `timm.models.save_for_hf` writes it, and
`hubvit.convert_timm` converts the folder, checking the converted model against timm's forward on the same input
(1e-5 of the output scale), or refuses, naming what hubvit lacks (a tag timm cannot build with one block is read
whole on the meta device for what hubvit lacks, then converted whole or, too large for this machine, with one
block of each key/value head count: Sapiens2). Tags whose architecture and head size are the same
share one conversion. The record is rewritten atomically after every tag, so a stopped walk resumes where it was.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

MODULES = (
    "vision_transformer",
    "deit",
    "eva",
    "beit",
    "vision_transformer_relpos",
    "vision_transformer_sam",
    "naflexvit",
)
HYBRID = "CNN-stem hybrid (out of scope)"
WHOLE_LIMIT = 400_000_000  # parameters: what this machine builds, converts and checks whole


def write_atomically(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(path.suffix + ".partial")
    scratch.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(scratch, path)


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def refusal_features(message: str) -> list[str]:
    """The indented feature lines of a converter refusal (what hubvit lacks), without the tensor listing."""
    lines = message.splitlines()
    features = []
    for line in lines[1:]:
        if line.startswith("  source tensors"):
            break
        if line.startswith("    "):
            features.append(line.strip())
    return features or [first_line(Exception(message))]


def convert_tag(timm, name: str, model_args: dict | None = None) -> dict:
    """One tag: built with one block (or `model_args`), written, converted (with the parity check) or refused."""
    import torch

    import hubvit
    from hubvit.errors import HubViTError

    started = time.time()
    architecture = name.split(".")[0]
    model_args = {"depth": 1} if model_args is None else model_args
    try:
        model = timm.create_model(name, pretrained=False, **model_args).eval()
    except Exception as error:  # noqa: BLE001  (timm itself cannot build it with one block: read it whole)
        if not model_args:
            return {"status": "not built", "detail": f"timm: {first_line(error)}", "seconds": time.time() - started}
        return read_whole(timm, name, f"timm: {first_line(error)}", started)
    if getattr(getattr(model, "patch_embed", None), "backbone", None) is not None:
        return {"status": "out of scope", "detail": HYBRID, "seconds": time.time() - started}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "timm"
        with torch.no_grad():
            timm.models.save_for_hf(model, folder, model_args=model_args, safe_serialization=True)
        del model
        gc.collect()
        try:
            result = hubvit.convert_timm(folder, Path(scratch) / "out")
        except HubViTError as error:
            return {"status": "refused", "features": refusal_features(str(error)), "seconds": time.time() - started}
        except Exception as error:  # noqa: BLE001  (a crash of the converter is a bug: recorded as one)
            detail = f"{type(error).__name__}: {first_line(error)}"
            return {"status": "crashed", "detail": detail, "seconds": time.time() - started}
    return {
        "status": "converted",
        "check": [line for line in result.lines if "max |" in line][:2],
        "architecture": architecture,
        "seconds": round(time.time() - started, 1),
    }


def read_whole(timm, name: str, detail: str, started: float) -> dict:
    """A tag timm cannot build with one block (per-block settings, as Sapiens2's key/value heads): its whole
    architecture on the meta device, read by the converter; what hubvit lacks is recorded as a refusal, and an
    architecture hubvit expresses is built whole and converted when it is small enough (`WHOLE_LIMIT`), else with
    one block of each key/value head count, in order."""
    from hubvit.conversion.timm import read_settings

    try:
        with __import__("torch").device("meta"):
            model = timm.create_model(name, pretrained=False)
        _, problems = read_settings(model, name.split(".")[0])
    except Exception as error:  # noqa: BLE001  (recorded, as the one-block build's failure)
        return {
            "status": "not built",
            "detail": f"{detail}; whole: {first_line(error)}",
            "seconds": time.time() - started,
        }
    if problems:
        return {"status": "refused", "features": problems, "seconds": time.time() - started}
    if sum(p.numel() for p in model.parameters()) <= WHOLE_LIMIT:
        return {**convert_tag(timm, name, model_args={}), "built": "whole (timm cannot build it with one block)"}
    kinds = list(dict.fromkeys(getattr(block.attn, "num_kv_heads", None) for block in model.blocks))
    if None in kinds:
        return {"status": "not built", "detail": detail, "seconds": time.time() - started}
    one_of_each = dict(depth=len(kinds), num_kv_heads=tuple(kinds))
    return {**convert_tag(timm, name, model_args=one_of_each), "built": f"one block of each kind: {one_of_each}"}


def markdown(record: dict, markdown_table) -> str:
    """The record as docs/conversion.md shows it (`scripts/render_docs.py` renders it): tags converted per module,
    then every refusal with what it names and the tags it covers."""
    rows = [
        (f"`{module}`", row["tags"], row["converted"], f"{row['converted'] / row['tags']:.0%}" if row["tags"] else "-")
        for module, row in record["summary"].items()
    ]
    tags = sum(row["tags"] for row in record["summary"].values())
    converted = sum(row["converted"] for row in record["summary"].values())
    rows.append(("**all**", f"**{tags}**", f"**{converted}**", f"**{converted / tags:.1%}**"))
    refusals = {}
    for tag, result in sorted(record["results"].items()):
        if result["status"] != "converted":
            why = "; ".join(result.get("features") or [result.get("detail", result["status"])])
            refusals.setdefault((result["status"], why), []).append(tag)
    refusal_rows = [
        (status, why, f"{len(names)}: " + ", ".join(f"`{name}`" for name in names))
        for (status, why), names in sorted(refusals.items())
    ]
    env = record["environment"]
    return (
        markdown_table(["timm module", "pretrained tags", "converted", "share"], rows)
        + "\n\n"
        + markdown_table(["status", "what hubvit lacks (the converter's words)", "tags"], refusal_rows)
        + f"\n\ntimm {env['timm']}, torch {env['torch']}, CPU ISA {env['cpu_isa']}; each tag built with one block "
        "and timm's random initialisation, converted with the parity check (1e-5 of the output scale)."
    )


def environment() -> dict:
    import timm
    import torch

    from hubvit.cpu import cpu_isa

    return {
        "timm": timm.__version__,
        "torch": torch.__version__,
        "cpu_isa": cpu_isa(),
        "python": platform.python_version(),
    }


def summary(results: dict, modules: dict) -> dict:
    table = {}
    for module, tags in modules.items():
        statuses = [results[tag]["status"] for tag in tags if tag in results]
        table[module] = {
            "tags": len(tags),
            "walked": len(statuses),
            "converted": statuses.count("converted"),
            "out_of_scope": statuses.count("out of scope"),
        }
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="the record to write (and resume from)")
    parser.add_argument("--modules", nargs="*", default=list(MODULES))
    parser.add_argument("--limit", type=int, default=None, help="walk at most this many new tags")
    parser.add_argument(
        "--again", nargs="*", default=[], metavar="STATUS", help="walk the recorded tags with these statuses again"
    )
    options = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import timm

    modules = {m: sorted(timm.list_models(module=m, pretrained=True, include_tags=True)) for m in options.modules}
    record = json.loads(options.json.read_text()) if options.json.is_file() else {}
    if record.get("environment", {}).get("timm") not in (None, timm.__version__):
        record = {}  # another timm: its tags and classes may differ, so walk again
    results = {tag: r for tag, r in record.get("results", {}).items() if r["status"] not in options.again}
    shared = {}
    walked = 0
    for module, tags in modules.items():
        for tag in tags:
            if tag in results:
                continue
            if options.limit is not None and walked >= options.limit:
                break
            cfg = timm.models.get_pretrained_cfg(tag)
            key = (tag.split(".")[0], getattr(cfg, "num_classes", None))
            outcome = dict(shared[key], shared_with=shared[key]["tag"]) if key in shared else convert_tag(timm, tag)
            outcome = {**outcome, "tag": outcome.get("tag", tag), "module": module}
            shared.setdefault(key, {**outcome, "tag": tag})
            results[tag] = {k: v for k, v in outcome.items() if k != "tag"}
            walked += 1
            print(f"{module:26} {tag:60} {results[tag]['status']}", flush=True)
            write_atomically(
                options.json,
                {"environment": environment(), "summary": summary(results, modules), "results": results},
            )
    table = summary(results, modules)
    for module, row in table.items():
        print(f"{module:26} {row['converted']:4} of {row['tags']:4} converted ({row['walked']} walked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
