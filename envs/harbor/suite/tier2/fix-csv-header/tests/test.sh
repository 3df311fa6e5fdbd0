#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
[ "$(sha256sum < report.py | cut -d' ' -f1)" = "5e2889cfedbf73171f2ec8e77a45fc70bec92b3f92a76c66ddfe57d8be423dc0" ] || reward 0
[ "$(python3 report.py)" = "5 people; oldest: Grace" ] || reward 0
reward 1
