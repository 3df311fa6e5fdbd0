import csv

with open("/app/people.csv", newline="") as f:
    rows = list(csv.DictReader(f))
oldest = max(rows, key=lambda r: int(r["age"]))
print(f"{len(rows)} people; oldest: {oldest['name']}")
