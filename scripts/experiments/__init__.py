"""One script per claim of the design document; each writes JSON, a PNG and markdown to docs/experiments/."""
