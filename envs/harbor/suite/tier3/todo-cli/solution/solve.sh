#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
cat > todo.py <<'EOF'
"""A to-do list in a JSON file ($TODO_FILE, default /app/todo.json)."""

import argparse
import json
import os
import sys

PATH = os.environ.get("TODO_FILE", "/app/todo.json")


def load():
    try:
        with open(PATH) as f:
            return json.load(f)
    except FileNotFoundError:
        return []


def save(items):
    with open(PATH, "w") as f:
        json.dump(items, f)


def main(argv):
    parser = argparse.ArgumentParser(prog="todo")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("add").add_argument("text")
    sub.add_parser("list")
    sub.add_parser("done").add_argument("id", type=int)
    args = parser.parse_args(argv)
    items = load()
    if args.command == "add":
        items.append({"id": len(items) + 1, "text": args.text, "done": False})
        save(items)
        print(f"added {len(items)}")
    elif args.command == "list":
        for item in items:
            print(f"{item['id']} [{'x' if item['done'] else ' '}] {item['text']}")
    else:
        found = [item for item in items if item["id"] == args.id]
        if not found:
            print(f"no item {args.id}", file=sys.stderr)
            return 1
        found[0]["done"] = True
        save(items)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
EOF
python3 -m pytest -q -p no:cacheprovider tests > /dev/null
