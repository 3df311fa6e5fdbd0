#!/bin/bash
# Verifier: the hidden copy of the tests pass, main.py prints the report, no old name remains.
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
PYTHONPATH=/app timeout 45 python3 -m pytest -p no:cacheprovider -q /tests/test_outputs.py \
  > /logs/verifier/pytest.log 2>&1 || reward 0
[ "$(python3 main.py)" = "$(printf 'circle r=1: 3.14\nrect 2x5: 10.00')" ] || reward 0
! grep -rqE 'area_of_(circle|rect)' --include='*.py' /app || reward 0
reward 1
