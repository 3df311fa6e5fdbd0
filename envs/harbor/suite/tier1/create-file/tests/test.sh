#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
[ -f hello.txt ] || reward 0
[ "$(cat hello.txt)" = "hello world" ] || reward 0
[ "$(wc -l < hello.txt)" -le 1 ] || reward 0
reward 1
