#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
jq -r '["id", "name", "email"], (map(select(.active)) | sort_by(.id) | .[] | [.id, .name, .email])
       | map(tostring) | join(",")' /app/users.json > /app/active_users.csv
