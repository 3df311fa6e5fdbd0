import sys


def mean(values):
    return sum(values) / (len(values) - 1)


if __name__ == "__main__":
    numbers = [float(x) for x in sys.argv[1:]]
    print(f"{mean(numbers):.2f}")
