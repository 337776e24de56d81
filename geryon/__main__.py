"""`python -m geryon` is the `geryon` command."""
import sys

from geryon.cli import main

sys.exit(main())
