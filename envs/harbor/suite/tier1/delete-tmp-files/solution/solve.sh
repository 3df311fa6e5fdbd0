#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
find /app/cache -type f -name '*.tmp' -delete
