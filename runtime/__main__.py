import sys

from runtime.app.cli import main

sys.exit(main())
