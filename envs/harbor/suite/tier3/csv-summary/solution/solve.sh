#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
python3 - <<'EOF'
import csv
from collections import defaultdict

units, revenue = defaultdict(int), defaultdict(float)
with open("/app/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        units[row["region"]] += int(row["units"])
        revenue[row["region"]] += int(row["units"]) * float(row["unit_price"])
with open("/app/summary.csv", "w") as out:
    out.write("region,units,revenue\n")
    for region in sorted(units):
        out.write(f"{region},{units[region]},{revenue[region]:.2f}\n")
EOF
