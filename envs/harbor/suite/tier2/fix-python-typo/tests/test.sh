#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
[ "$(python3 greet.py Ann)" = "Hello, Ann!" ] || reward 0
[ "$(python3 greet.py Bob)" = "Hello, Bob!" ] || reward 0
reward 1
