#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
mkdir -p /app/build/output
