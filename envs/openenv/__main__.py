"""`python -m envs.openenv --port 8000 --max-sessions 64`: OpenEnv's echo server until Ctrl-C."""

import sys

from envs.openenv.server import main

sys.exit(main())
