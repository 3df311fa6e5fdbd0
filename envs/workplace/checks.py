"""Argument checks of the office's tools: lenient where meaning is unambiguous (enum case, a
datetime without seconds, an id as an integer), strict where it is not. Each raises ToolError,
which the agent loop hands back to the model, before anything changes."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Optional

from envs.workplace.office import DAY_END, DAY_START, Office, ToolError


def _text(value: Any, name: str, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ToolError(f"{name} must be a string, got {type(value).__name__}")
    if not empty and not value.strip():
        raise ToolError(f"{name} must not be empty")
    return value.strip()


def _id(value: Any, name: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = _text(value, name)
    if not text.isdigit():
        raise ToolError(f"{name} must be a numeric id such as '00000005', got {text!r}")
    return text.zfill(8)


def _record(table: dict, value: Any, name: str) -> dict:
    key = _id(value, name)
    if key not in table:
        raise ToolError(f"no record with {name} {key!r}")
    return table[key]


def _record_view(table: dict, value: Any, name: str, field: Optional[str]) -> dict:
    """A record by id, whole or one field of it (the get_*_information_by_id tools)."""
    record = _record(table, value, name)
    return dict(record) if field is None else {field: record[_field(field, list(record))]}


def _date(value: Any, name: str) -> str:
    text = _text(value, name)
    try:
        return datetime.strptime(text, "%Y-%m-%d").date().isoformat()
    except ValueError:
        raise ToolError(f"{name} must be a date as YYYY-MM-DD, got {text!r}") from None


def _datetime(value: Any, name: str) -> str:
    text = _text(value, name)
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M"):
        try:
            return datetime.strptime(text, fmt).strftime("%Y-%m-%d %H:%M:%S")
        except ValueError:
            pass
    raise ToolError(f"{name} must be a datetime as YYYY-MM-DD HH:MM:SS, got {text!r}")


def _minutes(value: Any, name: str) -> str:
    try:
        minutes = int(str(value).strip())
    except ValueError:
        raise ToolError(f"{name} must be a whole number of minutes, got {value!r}") from None
    if not 0 < minutes <= DAY_END - DAY_START:
        raise ToolError(f"{name} must be between 1 and {DAY_END - DAY_START} minutes, got {minutes}")
    return str(minutes)


def _choice(value: Any, name: str, options: list[str]) -> str:
    text = _text(value, name)
    for option in options:
        if text.lower() == option.lower():
            return option
    raise ToolError(f"{name} must be one of {', '.join(repr(o) for o in options)}; got {text!r}")


def _address(value: Any, name: str) -> str:
    text = _text(value, name).lower()
    if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-z]{2,}", text):
        raise ToolError(f"{name} must be an email address, got {text!r}")
    return text


def _employee(office: Office, value: Any, name: str) -> str:
    text = _address(value, name)
    if text not in {e["email"] for e in office.employees}:
        raise ToolError(
            f"{name} {text!r} is not in the company directory; look it up with company_directory_find_email_address"
        )
    return text


def _field(value: Any, fields: list[str]) -> str:
    text = _text(value, "field")
    if text not in fields:
        raise ToolError(f"field must be one of {', '.join(repr(f) for f in fields)}; got {text!r}")
    return text


def _page(items: list, page: Any, page_size: Any) -> list:
    try:
        page, page_size = int(page), int(page_size)
    except (TypeError, ValueError):
        raise ToolError("page and page_size must be integers") from None
    if page < 1 or page_size < 1:
        raise ToolError("page and page_size must be >= 1")
    return items[(page - 1) * page_size : page * page_size]


def _check_hours(start: str, duration: str) -> None:
    t = datetime.strptime(start, "%Y-%m-%d %H:%M:%S")
    begin = t.hour * 60 + t.minute
    if begin < DAY_START or begin + int(duration) > DAY_END:
        raise ToolError(
            f"meetings must not start before 9am or end after 6pm; {start} for {duration} minutes does not fit"
        )


def _range(time_min: Any, time_max: Any) -> tuple[str, str]:
    lo = _date(time_min, "time_min") if time_min is not None else "0000-00-00"
    hi = _date(time_max, "time_max") if time_max is not None else "9999-99-99"
    return lo, hi
