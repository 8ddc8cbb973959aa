"""One script per claim of the blog post "Vision Transformer (ViT) from First Principles"; each writes JSON, a PNG and markdown to docs/experiments/."""
