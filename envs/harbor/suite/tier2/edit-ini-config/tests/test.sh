#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
python3 - <<'EOF' || reward 0
import configparser
c = configparser.ConfigParser()
assert c.read("/app/app.ini")
assert {s: dict(c[s]) for s in c.sections()} == {
    "server": {"host": "0.0.0.0", "port": "8000", "workers": "4"},
    "logging": {"level": "warning", "file": "/var/log/app.log"},
}
EOF
reward 1
