#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
sed -i '1s/nmae/name/' people.csv
