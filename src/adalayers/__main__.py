"""`python -m adalayers ...` (what `torchrun -m adalayers ...` runs): the adalayers command line."""
import sys

from adalayers.cli import main

sys.exit(main())
