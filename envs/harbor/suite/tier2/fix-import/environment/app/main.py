import sys

from utils import slug

if __name__ == "__main__":
    print(slug(" ".join(sys.argv[1:])))
