import calc
import pytest
from calc import divide, multiply, subtract


def test_subtract():
    assert subtract(10, 4) == 6
    assert subtract(1, 3) == -2


def test_multiply():
    assert multiply(3, 4) == 12
    assert multiply(-2, 5) == -10


def test_divide():
    assert divide(7, 2) == 3.5


def test_divide_by_zero_raises_value_error():
    with pytest.raises(ValueError):
        divide(1, 0)


def test_power():
    assert calc.power(2, 10) == 1024
    assert calc.power(5, 0) == 1
