import pytest
from inventory import Inventory


def make():
    inv = Inventory()
    inv.add("bolt", 10)
    inv.add("nut", 3)
    inv.add("bolt", 5)
    inv.add("gear", 1)
    return inv


def test_total_counts_every_unit():
    assert make().total_items() == 19


def test_remove_more_than_in_stock_raises():
    inv = make()
    with pytest.raises(ValueError):
        inv.remove("nut", 4)
    assert inv.quantity("nut") == 3


def test_remove_takes_units_away():
    inv = make()
    inv.remove("bolt", 15)
    assert inv.quantity("bolt") == 0


def test_low_stock_lists_items_below_the_threshold_sorted():
    assert make().low_stock(5) == ["gear", "nut"]
