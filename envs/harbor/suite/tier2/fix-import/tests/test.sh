#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
[ "$(sha256sum < utils.py | cut -d' ' -f1)" = "508d1180e50026ef495fc2d1ad58597c1fc6c1861d8953a8bf183d904f0f325c" ] || reward 0
[ "$(python3 main.py 'Hello World')" = "hello-world" ] || reward 0
[ "$(python3 main.py Rollout  Farm Test)" = "rollout-farm-test" ] || reward 0
reward 1
