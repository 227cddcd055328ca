"""`python -m adalayers.cli ...`: the adalayers command line (as `python -m adalayers`)."""
import sys

from adalayers.cli import main

sys.exit(main())
