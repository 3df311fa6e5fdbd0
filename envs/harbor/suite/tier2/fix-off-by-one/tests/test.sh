#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
[ "$(python3 stats.py 1 2 3)" = "2.00" ] || reward 0
[ "$(python3 stats.py 4 8)" = "6.00" ] || reward 0
[ "$(python3 stats.py 5)" = "5.00" ] || reward 0
reward 1
