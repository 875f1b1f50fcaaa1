import sys

from synclib.cli import main

sys.exit(main())
