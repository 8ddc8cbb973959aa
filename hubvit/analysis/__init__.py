"""The arithmetic of the blog post "Vision Transformer (ViT) from First Principles" and pictures for any hubvit model: `hubvit info` and `hubvit analyze`.

info (tokens, attention memory, parameters, MACs from a config), attention (mean attention distance, rollout,
last-layer maps), position (position-embedding similarity, relative bias), plots (matplotlib Agg), source (SRC and
images), commands (the command line).
"""
