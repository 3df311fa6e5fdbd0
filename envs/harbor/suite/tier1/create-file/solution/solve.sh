#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
echo "hello world" > /app/hello.txt
