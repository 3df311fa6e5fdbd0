#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
rm -rf out
make > /dev/null 2>&1 || reward 0
[ "$(cat out/hello.txt)" = "HELLO MAKE" ] || reward 0
reward 1
