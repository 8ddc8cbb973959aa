"""Runnable entry points (the `hubvit` command, fine-tuning); thin wrappers around the library."""
