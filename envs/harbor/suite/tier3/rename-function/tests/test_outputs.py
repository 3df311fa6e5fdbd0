from shapes.geometry import circle_area, rect_area
from shapes.report import report


def test_circle_area():
    assert round(circle_area(2), 2) == 12.57


def test_rect_area():
    assert rect_area(3, 4) == 12


def test_report():
    assert report() == "circle r=1: 3.14\nrect 2x5: 10.00"
