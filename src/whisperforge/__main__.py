"""`python -m whisperforge` runs the command line."""

from .cli import main

raise SystemExit(main())
