"""`python -m workers.policy.stub`: run the stub server in the foreground (see server.py)."""

import sys

from workers.policy.stub.server import main

sys.exit(main())
