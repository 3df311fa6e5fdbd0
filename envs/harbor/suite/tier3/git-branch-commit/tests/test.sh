#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
cd /app/repo || reward 0
[ "$(git rev-parse --abbrev-ref HEAD)" = "feature/greeting" ] || reward 0
[ "$(git log -1 --format=%s)" = "Add greeting" ] || reward 0
[ "$(git show HEAD:greeting.txt)" = "hi there" ] || reward 0
[ -z "$(git status --porcelain)" ] || reward 0
[ "$(git rev-list --count main)" = "1" ] || reward 0
[ "$(git rev-parse HEAD~1)" = "$(git rev-parse main)" ] || reward 0
reward 1
