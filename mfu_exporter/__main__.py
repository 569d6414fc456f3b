import sys

from mfu_exporter.cli import main

sys.exit(main())
