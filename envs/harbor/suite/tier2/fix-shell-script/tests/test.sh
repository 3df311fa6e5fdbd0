#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
rm -rf backup
bash backup.sh > /dev/null 2>&1 || reward 0
[ "$(cat backup/a.txt)" = "first" ] && [ "$(cat backup/b.txt)" = "second" ] || reward 0
[ ! -e backup/c.md ] || reward 0
reward 1
