#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
grep -c ERROR /app/server.log > /app/answer.txt
