#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
wc -l < /app/data.txt > /app/answer.txt
