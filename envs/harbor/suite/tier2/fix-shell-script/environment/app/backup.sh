#!/bin/bash
# Copy every .txt file of /app/notes into /app/backup.
set -euo pipefail
SOURCE=/app/notes
DEST=/app/backup
mkdir -p "$DEST"
cp "$SRC"/*.txt "$DEST"/
echo "backed up $(ls "$DEST" | wc -l) files"
