"""``python -m evenflow`` runs the CLI (used by torchrun and the launcher)."""
import sys

from evenflow.cli import main

sys.exit(main())
