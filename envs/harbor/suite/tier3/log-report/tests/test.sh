#!/bin/bash
# Verifier: one third of the reward for each correct key of report.json (reward.json).
mkdir -p /logs/verifier
cd /app || exit 0
python3 - <<'EOF'
import json

expected = {"files": 3, "levels": {"ERROR": 20, "INFO": 54, "WARNING": 16}, "top_ip": "10.0.0.9"}
try:
    with open("/app/report.json") as f:
        got = json.load(f)
except (OSError, ValueError):
    got = {}
right = sum(1 for key, value in expected.items() if isinstance(got, dict) and got.get(key) == value)
with open("/logs/verifier/reward.json", "w") as f:
    json.dump({"reward": round(right / len(expected), 4)}, f)
EOF
