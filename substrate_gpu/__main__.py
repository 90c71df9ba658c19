"""``python -m substrate_gpu`` runs the CLI."""

from __future__ import annotations

import sys

from substrate_gpu.cli import main

sys.exit(main())
