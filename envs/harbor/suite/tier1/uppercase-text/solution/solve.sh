#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
tr '[:lower:]' '[:upper:]' < /app/text.txt > /app/upper.txt
