#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
sed -i -e 's/^workers = 1$/workers = 4/' -e 's/^level = debug$/level = warning/' app.ini
