"""``python -m synclib.cli ...``: the same as ``synclib ...`` (:func:`synclib.cli.main`)."""
import sys

from synclib.cli import main

sys.exit(main())
