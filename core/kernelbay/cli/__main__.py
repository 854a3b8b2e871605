import sys

from kernelbay.cli import main

sys.exit(main())
