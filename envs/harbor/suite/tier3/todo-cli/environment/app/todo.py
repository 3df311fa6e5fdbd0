"""A to-do list in a JSON file ($TODO_FILE, default /app/todo.json)."""

import argparse
import os
import sys

PATH = os.environ.get("TODO_FILE", "/app/todo.json")


def load():
    raise NotImplementedError


def save(items):
    raise NotImplementedError


def main(argv):
    parser = argparse.ArgumentParser(prog="todo")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("add").add_argument("text")
    sub.add_parser("list")
    sub.add_parser("done").add_argument("id", type=int)
    args = parser.parse_args(argv)
    raise NotImplementedError(args.command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
