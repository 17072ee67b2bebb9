"""`python -m kvlab.train [ARCH ...] [options]`: the same as `kvlab train`."""
import sys

from ..cli import main

sys.exit(main(["train", *sys.argv[1:]]))
