#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
cd /app/repo || reward 0
[ ! -e .git/MERGE_HEAD ] || reward 0
[ "$(git rev-parse --abbrev-ref HEAD)" = "main" ] || reward 0
[ "$(git rev-list --parents -n 1 HEAD | wc -w)" = "3" ] || reward 0
[ "$(git rev-parse HEAD^2)" = "$(git rev-parse colors)" ] || reward 0
[ "$(git log -1 --format=%s HEAD^1)" = "Blue" ] || reward 0
[ "$(git show HEAD:settings.txt)" = "$(printf 'name = demo\ncolor = blue\naccent = green')" ] || reward 0
[ -z "$(git status --porcelain)" ] || reward 0
reward 1
