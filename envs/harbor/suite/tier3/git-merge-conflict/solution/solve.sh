#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
cd /app/repo
printf 'name = demo\ncolor = blue\naccent = green\n' > settings.txt
git add settings.txt
git commit -q --no-edit
