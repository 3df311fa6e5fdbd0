#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
jq -e '.name == "inventory" and .port == 8080 and .debug == false
       and .hosts == ["a.internal", "b.internal"] and (keys | length) == 4' config.json > /dev/null || reward 0
reward 1
