import sys


def greet(name):
    return f"Hello, {name}!"


if __name__ == "__main__":
    pritn(greet(sys.argv[1]))
