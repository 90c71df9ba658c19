"""Exit codes of ``substrate-gpu`` (documented in the README)."""

from __future__ import annotations

EXIT_OK = 0
"""Success."""
EXIT_FAILED = 1
"""The operation failed; the message says what and where; nothing was half-written."""
EXIT_USAGE = 2
"""The command line itself is wrong (argparse's own code)."""
EXIT_INVALID = 3
"""Validation found problems in the input (e.g. ``pool validate``)."""
