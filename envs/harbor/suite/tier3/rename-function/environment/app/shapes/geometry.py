import math


def area_of_circle(r):
    return math.pi * r * r


def area_of_rect(w, h):
    return w * h
