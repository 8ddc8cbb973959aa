"""Shared pytest fixtures for the hubvit tests."""

# `hub_server`: a local fake of the Hugging Face Hub HTTP API with the client pointed at it (tests/hub_server.py).
try:
    from hub_server import hub_server  # noqa: F401
except ImportError:  # tests/ imported as a package
    from tests.hub_server import hub_server  # noqa: F401
