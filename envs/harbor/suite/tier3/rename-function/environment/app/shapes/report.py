from shapes.geometry import area_of_circle, area_of_rect


def report():
    return f"circle r=1: {area_of_circle(1):.2f}\nrect 2x5: {area_of_rect(2, 5):.2f}"
