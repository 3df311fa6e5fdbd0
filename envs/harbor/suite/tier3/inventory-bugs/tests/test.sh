#!/bin/bash
# Verifier: the hidden copy of the tests (/tests/test_outputs.py) against /app; 1 when all pass.
mkdir -p /logs/verifier
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if PYTHONPATH=/app timeout 45 python3 -m pytest -p no:cacheprovider -q /tests/test_outputs.py \
  > /logs/verifier/pytest.log 2>&1; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
