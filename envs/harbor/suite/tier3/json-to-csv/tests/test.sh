#!/bin/bash
# Verifier: reward 1 when every check below holds, else 0 (a missing file fails the check).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
cd /app || reward 0
[ -f active_users.csv ] || reward 0
[ "$(tr -d '\r' < active_users.csv | sed '/^$/d')" = "$(printf 'id,name,email\n2,Ada,ada@example.org\n7,Grace,grace@example.org\n9,Edsger,edsger@example.org\n11,Barbara,barbara@example.org')" ] || reward 0
reward 1
