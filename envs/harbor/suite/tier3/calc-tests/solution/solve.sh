#!/bin/bash
# The reference solution.
set -euo pipefail
cd /app
cat > calc/ops.py <<'EOF'
"""Arithmetic on two numbers."""


def add(a, b):
    return a + b


def subtract(a, b):
    return a - b


def multiply(a, b):
    return a * b


def divide(a, b):
    if b == 0:
        raise ValueError("division by zero")
    return a / b


def power(a, b):
    return a**b
EOF
cat > calc/__init__.py <<'EOF'
from calc.ops import add, divide, multiply, power, subtract

__all__ = ["add", "divide", "multiply", "power", "subtract"]
EOF
python3 -m pytest -q -p no:cacheprovider tests > /dev/null
