#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
sed -i 's/pritn(/print(/' greet.py
