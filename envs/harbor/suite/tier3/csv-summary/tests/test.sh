#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
[ -f summary.csv ] || reward 0
[ "$(tr -d '\r' < summary.csv | sed '/^$/d')" = "$(printf 'region,units,revenue\neast,9,32.00\nnorth,16,71.25\nsouth,7,40.00\nwest,2,20.00')" ] || reward 0
reward 1
