"""The package's version, the one place it is written (setup.py and pyproject.toml read it here,
openinfer.__version__ re-exports it). A leaf module: server.py and cli.py read it without
importing the package's __init__, which imports them lazily (no import cycle)."""

__version__ = "0.1.0"
