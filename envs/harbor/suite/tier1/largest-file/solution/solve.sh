#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
ls -S /app/files | head -n 1 > /app/answer.txt
