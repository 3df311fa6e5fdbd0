#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
sort /app/words.txt > /app/sorted.txt
