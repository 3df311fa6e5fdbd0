#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
[ -d cache ] || reward 0
[ -z "$(find cache -name '*.tmp')" ] || reward 0
[ -f cache/keep.txt ] && [ -f cache/sub/data.json ] || reward 0
reward 1
