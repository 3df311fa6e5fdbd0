import os
import subprocess
import sys

import pytest


@pytest.fixture
def todo(tmp_path):
    env = {**os.environ, "TODO_FILE": str(tmp_path / "todo.json")}

    def run(*args):
        return subprocess.run([sys.executable, "/app/todo.py", *args], capture_output=True, text=True, env=env)

    return run


def test_add_prints_the_new_id(todo):
    assert todo("add", "buy milk").stdout.strip() == "added 1"
    assert todo("add", "call bob").stdout.strip() == "added 2"


def test_list_shows_items_in_order(todo):
    todo("add", "buy milk")
    todo("add", "call bob")
    done = todo("list")
    assert done.returncode == 0
    assert done.stdout.splitlines() == ["1 [ ] buy milk", "2 [ ] call bob"]


def test_done_marks_an_item(todo):
    todo("add", "a")
    todo("add", "b")
    assert todo("done", "2").returncode == 0
    assert todo("list").stdout.splitlines() == ["1 [ ] a", "2 [x] b"]


def test_done_of_an_unknown_id_fails(todo):
    done = todo("done", "5")
    assert done.returncode != 0
    assert "no item 5" in done.stderr


def test_list_of_nothing_prints_nothing(todo):
    done = todo("list")
    assert done.returncode == 0
    assert done.stdout == ""
