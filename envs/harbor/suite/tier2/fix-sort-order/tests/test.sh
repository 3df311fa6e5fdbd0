#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
[ "$(python3 rank.py)" = "$(printf 'bob\ncy\nann\ndee')" ] || reward 0
python3 -c "import sys; sys.path.insert(0, '/app'); from rank import ranking
assert ranking({'x': 1, 'y': 3, 'z': 2}) == ['y', 'z', 'x']" 2> /dev/null || reward 0
reward 1
