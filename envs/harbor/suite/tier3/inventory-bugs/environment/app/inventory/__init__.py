from inventory.stock import Inventory

__all__ = ["Inventory"]
