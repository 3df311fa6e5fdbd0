#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
sed -i 's/key=lambda item: item\[1\])/key=lambda item: item[1], reverse=True)/' rank.py
