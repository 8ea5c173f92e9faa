"""``python -m app.dev``: what ``make dev`` runs (:mod:`app.dev.stack`)."""
import sys

from app.dev.stack import main

sys.exit(main())
