#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
sed -i 's|sum(values) / (len(values) - 1)|sum(values) / len(values)|' stats.py
