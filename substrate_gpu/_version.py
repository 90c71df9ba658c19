"""The package's version: the one place it is written (pyproject.toml reads it from here,
``[tool.setuptools.dynamic]``), so code that names it needs no ``importlib.metadata``
(whose import is a large share of a short command's start)."""

VERSION = "0.1.0"
