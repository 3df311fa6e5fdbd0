#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
sed -i 's|"\$SRC"|"$SOURCE"|' backup.sh
