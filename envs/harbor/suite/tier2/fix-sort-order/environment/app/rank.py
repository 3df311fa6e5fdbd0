import json


def ranking(scores):
    """Names from the highest score to the lowest."""
    return [name for name, _ in sorted(scores.items(), key=lambda item: item[1])]


if __name__ == "__main__":
    with open("/app/scores.json") as f:
        print("\n".join(ranking(json.load(f))))
