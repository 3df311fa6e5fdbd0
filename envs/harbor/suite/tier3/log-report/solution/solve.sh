#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
python3 - <<'EOF'
import json
import re
from collections import Counter
from pathlib import Path

files = sorted(Path("/app/logs").glob("*.log"))
levels, ips = Counter(), Counter()
for path in files:
    for line in path.read_text().splitlines():
        match = re.match(r"\S+ (\w+) request from (\S+)", line)
        if match:
            levels[match.group(1)] += 1
            ips[match.group(2)] += 1
report = {"files": len(files), "levels": dict(levels), "top_ip": ips.most_common(1)[0][0]}
Path("/app/report.json").write_text(json.dumps(report, indent=2) + "\n")
EOF
