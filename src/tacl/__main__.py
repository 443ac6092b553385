import sys

from tacl.cli import main

sys.exit(main())
