#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
cd /app/repo
git checkout -q -b feature/greeting main
echo 'hi there' > greeting.txt
git add greeting.txt
git commit -q -m 'Add greeting'
