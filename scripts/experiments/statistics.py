"""The statistics every verdict rests on: paired differences over seeds with their t intervals, and equivalence
against a margin fixed before any run."""

import json

import numpy as np

# Five seeds: a paired 95% t interval then uses t(4) = 2.78 standard errors; with three, t(2) = 4.30.
DEFAULT_SEEDS = 5
REQUIRED_SEEDS = DEFAULT_SEEDS


def gather(records, arms, keys):
    """(setup, runs) from unit records: `runs[arm][key]` lists ordered by seed, as the experiments' summaries read
    them; records whose setup differs from the first are refused."""
    setups = {json.dumps(r["setup"], sort_keys=True) for r in records}
    if len(setups) != 1:
        raise ValueError(f"the unit records of {records[0]['experiment']} differ in their setup; only seeds may differ")
    runs = {arm: {key: [] for key in keys} for arm in arms}
    for record in sorted(records, key=lambda r: (r["seed"], arms.index(r["arm"]))):
        run = runs[record["arm"]]
        run["seeds"].append(record["seed"])
        for key in keys:
            if key != "seeds":
                run[key].append(record["values"][key])
    return records[0]["setup"], runs


def minutes_per_run(records):
    """Measured minutes per unit (whole unit, resumed parts added): min, median, max and count."""
    minutes = sorted(r["minutes"] for r in records if r.get("minutes") is not None)
    if not minutes:
        return None
    return {
        "min": minutes[0],
        "median": float(np.median(minutes)),
        "max": minutes[-1],
        "runs": len(minutes),
        "torch_threads": sorted({r["environment"]["torch_threads"] for r in records}),
    }


def seed_counts(runs):
    return {arm: len(run["seeds"]) for arm, run in runs.items()}


def undecided(verdicts, runs, required=REQUIRED_SEEDS):
    """Verdicts as they may be stated: while an arm has fewer than `required` seeds, each says "not yet decided"
    and how many seeds each arm has, then what the seeds so far show."""
    short = {arm: n for arm, n in seed_counts(runs).items() if n < required}
    if not short:
        return verdicts
    counts = ", ".join(f"{arm} {n}" for arm, n in short.items())
    head = f"not yet decided (seeds of {required} so far: {counts})"
    if min(short.values()) < 2:
        return [dict(v, verdict=f"{head}; an arm with one seed has no interval yet") for v in verdicts]
    return [dict(v, verdict=f"{head}; the seeds so far: {v['verdict']}") for v in verdicts]


def decide(results, verdicts, runs, required=REQUIRED_SEEDS):
    """Store in `results` the verdicts as they may be stated (`undecided`) and the seeds per arm they rest on,
    which the page prints; `runs` maps each arm to its runs, whatever shape the experiment's own runs have."""
    results["seeds_per_arm"] = seed_counts(runs)
    results["verdicts"] = undecided(verdicts, runs, required)


def paired_difference(a, b, confidence=0.95):
    """Mean of the per-seed differences a - b (same seed, same split) with its two-sided t interval; the interval
    is infinite with fewer than two pairs, so that no verdict is drawn from a single run."""
    from scipy import stats

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = len(d)
    if n < 2:
        return {
            "difference": float(d.mean()),
            "low": -float("inf"),
            "high": float("inf"),
            "half_width": float("inf"),
            "pairs": n,
        }
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * d.std(ddof=1) / np.sqrt(n))
    return {
        "difference": float(d.mean()),
        "low": float(d.mean()) - half,
        "high": float(d.mean()) + half,
        "half_width": half,
        "pairs": n,
    }


def paired(runs, a, b, key="accuracy"):
    """`paired_difference` of two arms' `key`, matched by seed (the seeds both arms ran)."""
    left, right = dict(zip(runs[a]["seeds"], runs[a][key])), dict(zip(runs[b]["seeds"], runs[b][key]))
    seeds = sorted(set(left) & set(right))
    return paired_difference([left[s] for s in seeds], [right[s] for s in seeds])


def interval_text(diff, scale=100):
    if diff["pairs"] < 2:
        return f"{scale * diff['difference']:+.2f} points (one paired seed: no interval yet)"
    return (
        f"{scale * diff['difference']:+.2f} points (95% CI {scale * diff['low']:+.2f} to "
        f"{scale * diff['high']:+.2f}, {diff['pairs']} paired seeds)"
    )


def equivalence(diff, margin):
    """Verdict on |a - b| < `margin` from a paired 95% interval: equivalent when the interval lies inside
    (-margin, margin), different when it lies outside, otherwise not resolved (with the smallest margin the
    interval could have shown equivalence for)."""
    low, high = diff["low"], diff["high"]
    if -margin < low and high < margin:
        return "equivalent"
    if low >= margin or high <= -margin:
        return "different"
    return "not resolved"


def resolvable_margin(diff):
    """The smallest margin m for which this interval would lie inside (-m, m)."""
    return max(abs(diff["low"]), abs(diff["high"]))


def mean_std(values):
    values = np.asarray(values, dtype=float)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def interval_cell(diff, scale=100):
    """A paired difference and its 95% interval for a table cell; one pair has no interval yet."""
    if diff["pairs"] < 2:
        return f"{scale * diff['difference']:+.2f} (one seed)"
    return f"{scale * diff['difference']:+.2f} ({scale * diff['low']:+.2f} to {scale * diff['high']:+.2f})"
