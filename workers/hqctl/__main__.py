import sys

from workers.hqctl.main import main

sys.exit(main())
