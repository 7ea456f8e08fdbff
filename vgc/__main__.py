import sys

from vgc.cli import main

sys.exit(main())
