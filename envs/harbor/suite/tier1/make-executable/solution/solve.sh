#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
chmod +x /app/run.sh
