#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
python3 - <<'EOF'
from pathlib import Path

path = Path("inventory/stock.py")
text = path.read_text()
text = text.replace(
    "        self._items[item] = self._items.get(item, 0) - qty",
    "        if self._items.get(item, 0) < qty:\n"
    "            raise ValueError(f\"only {self._items.get(item, 0)} {item} in stock\")\n"
    "        self._items[item] -= qty",
)
text = text.replace("return len(self._items)", "return sum(self._items.values())")
text = text.replace(
    "return [item for item, qty in self._items.items() if qty > threshold]",
    "return sorted(item for item, qty in self._items.items() if qty < threshold)",
)
path.write_text(text)
EOF
python3 -m pytest -q -p no:cacheprovider tests > /dev/null
