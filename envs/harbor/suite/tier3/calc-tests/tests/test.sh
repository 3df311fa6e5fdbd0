#!/bin/bash
# Verifier: the hidden copy of the tests (/tests/test_outputs.py) against /app; the reward is the
# fraction that pass (reward.json), so a partial fix earns partial credit.
mkdir -p /logs/verifier
cd /app || exit 0
PYTHONPATH=/app timeout 45 python3 -m pytest -p no:cacheprovider -q --junitxml=/tmp/verifier-junit.xml \
  /tests/test_outputs.py > /logs/verifier/pytest.log 2>&1
python3 - <<'EOF'
import json
import xml.etree.ElementTree as ET

try:
    root = ET.parse("/tmp/verifier-junit.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    total = int(suite.get("tests"))
    bad = sum(int(suite.get(k, 0)) for k in ("failures", "errors", "skipped"))
    reward = (total - bad) / total if total else 0.0
except (OSError, ET.ParseError, AttributeError, TypeError, ValueError):
    reward = 0.0
with open("/logs/verifier/reward.json", "w") as f:
    json.dump({"reward": round(reward, 4)}, f)
EOF
