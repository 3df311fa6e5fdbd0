"""Quantities of items in stock."""


class Inventory:
    def __init__(self):
        self._items = {}

    def add(self, item, qty):
        self._items[item] = self._items.get(item, 0) + qty

    def remove(self, item, qty):
        """Take `qty` units of `item`; ValueError when fewer are in stock."""
        self._items[item] = self._items.get(item, 0) - qty

    def quantity(self, item):
        return self._items.get(item, 0)

    def total_items(self):
        """Units in stock, all items together."""
        return len(self._items)

    def low_stock(self, threshold):
        """Items with fewer than `threshold` units, in alphabetical order."""
        return [item for item, qty in self._items.items() if qty > threshold]
