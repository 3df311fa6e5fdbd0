#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
grep -rlE 'area_of_(circle|rect)' --include='*.py' . | xargs sed -i -e 's/area_of_circle/circle_area/g' -e 's/area_of_rect/rect_area/g'
python3 -m pytest -q -p no:cacheprovider tests > /dev/null
