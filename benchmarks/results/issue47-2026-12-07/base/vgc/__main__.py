import sys

from vgc.shells.cli import main

sys.exit(main())
