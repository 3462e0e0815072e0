"""Time axes on any CF calendar, as numbers, text and checks.

xarray decodes a time axis to ``datetime64`` when it can and to ``cftime`` objects when it
cannot: climate-model calendars (``noleap``/``365_day``, ``all_leap``/``366_day``, ``360_day``,
``julian``) and dates outside ``datetime64[ns]``'s years 1678-2262 on the ``standard`` and
``proleptic_gregorian`` calendars. Everything in geonp that reads time values goes through this
module, so both kinds behave alike:

* :func:`days_since_epoch` gives float64 days since 1970-01-01 *in the axis' own calendar* (a
  ``360_day`` month is 30 days), which is what a model sees and what steps are compared by;
* :func:`parse_time` reads a user's ``2095-02-30T12`` as a date of the axis' calendar;
* :func:`format_time` writes one back (``np.datetime_as_string`` knows only ``datetime64``);
* :func:`check_time` refuses a repeated or decreasing axis, whatever its kind.

The values themselves are never converted: an output keeps the input's calendar and encoding.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

#: 1970-01-01, the origin of :func:`days_since_epoch` (a date on every CF calendar).
EPOCH = "1970-01-01"
_EPOCH64 = np.datetime64(f"{EPOCH}T00:00:00", "s")
#: ``YYYY-MM-DD[THH[:MM[:SS]]]`` (also ``YYYY-MM`` and a space for ``T``); years may have any digits.
_ISO = re.compile(r"^\s*(-?\d+)-(\d{1,2})(?:-(\d{1,2})(?:[T ](\d{1,2})(?::(\d{1,2})(?::(\d{1,2})(?:\.\d*)?)?)?)?)?"
                  r"\s*Z?\s*$")


def is_cftime(values: Any) -> bool:
    """True when ``values`` (an array or one value) hold ``cftime`` dates."""
    first = np.ravel(np.asarray(values, dtype=object))[:1]
    return bool(first.size) and hasattr(first[0], "calendar") and hasattr(first[0], "timetuple")


def is_time(values: Any) -> bool:
    """True for ``datetime64`` or ``cftime`` values (False for plain numbers)."""
    return np.issubdtype(np.asarray(values).dtype, np.datetime64) or is_cftime(values)


def calendar_of(values: Any) -> str:
    """The CF calendar of ``values``: a cftime date's own, ``proleptic_gregorian`` for datetime64."""
    if is_cftime(values):
        return str(np.ravel(np.asarray(values, dtype=object))[0].calendar)
    return "proleptic_gregorian"


def days_since_epoch(values: Any) -> np.ndarray:
    """``values`` as float64 days since 1970-01-01 in their own calendar; numbers pass through.

    Works for ``datetime64`` of any unit and for ``cftime`` dates (each array on one calendar,
    as xarray decodes it). The shape of ``values`` is kept.
    """
    array = np.asarray(values)
    if np.issubdtype(array.dtype, np.datetime64):  # NaT: NaN, not the huge negative count it casts to
        days = (array.astype("datetime64[s]") - _EPOCH64).astype(np.float64) / 86400.0
        return np.where(np.isnat(array), np.nan, days)
    if is_cftime(array):
        import cftime

        flat = array.astype(object).ravel()
        days = cftime.date2num(flat, f"days since {EPOCH}", calendar=calendar_of(flat),
                               has_year_zero=getattr(flat[0], "has_year_zero", None))
        return np.asarray(days, dtype=np.float64).reshape(array.shape)
    return array.astype(np.float64)


def hours_since_epoch(values: Any) -> np.ndarray:
    """``values`` as float64 hours since 1970-01-01 in their own calendar (numbers pass through)."""
    array = np.asarray(values)
    return days_since_epoch(array) * 24.0 if is_time(array) else array.astype(np.float64)


def from_hours(hours: np.ndarray, like: Any) -> np.ndarray:
    """Hours since 1970-01-01 back to dates of ``like``'s kind and calendar (datetime64[s] or cftime)."""
    hours = np.asarray(hours, dtype=np.float64)
    if is_cftime(like):
        import cftime

        first = np.ravel(np.asarray(like, dtype=object))[0]
        seconds = np.round(hours * 3600.0)
        return np.asarray(cftime.num2date(seconds, f"seconds since {EPOCH}", calendar=first.calendar,
                                          has_year_zero=getattr(first, "has_year_zero", None)), dtype=object)
    return _EPOCH64 + np.round(hours * 3600.0).astype("timedelta64[s]")


def parse_time(text: str, like: Any) -> Any:
    """The date ``text`` (``YYYY-MM[-DD[THH[:MM[:SS]]]]``) as a value comparable with ``like``.

    ``like`` is the time axis the date will be looked up in: a ``cftime`` axis gets a date of its
    calendar (``2095-02-30`` exists on ``360_day``), a ``datetime64`` axis a ``datetime64``.

    Raises:
        ValueError: ``text`` is not such a date, or not a date of ``like``'s calendar.
    """
    match = _ISO.match(str(text))
    if match is None:
        raise ValueError(f"{text!r} is not a date/time such as 2019-01-01T06")
    year, month, day, hour, minute, second = (int(g) if g else d for g, d in zip(match.groups(), (0, 1, 1, 0, 0, 0)))
    calendar = calendar_of(like)
    if is_cftime(like):
        import cftime

        first = np.ravel(np.asarray(like, dtype=object))[0]
        try:
            return cftime.datetime(year, month, day, hour, minute, second, calendar=calendar,
                                   has_year_zero=getattr(first, "has_year_zero", None))
        except ValueError:
            raise ValueError(f"{text!r} is not a date of the {calendar} calendar") from None
    try:
        return np.datetime64(f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}", "s")
    except ValueError:
        raise ValueError(f"{text!r} is not a valid date") from None


def format_time(value: Any, unit: str = "m") -> str:
    """One time value as ``YYYY-MM-DDTHH:MM`` (``unit`` ``"D"``, ``"h"``, ``"m"`` or ``"s"``); numbers as text."""
    if np.issubdtype(np.asarray(value).dtype, np.datetime64):
        return str(np.datetime_as_string(np.asarray(value), unit=unit))
    if is_cftime(value):
        v = np.ravel(np.asarray(value, dtype=object))[0]
        text = f"{v.year:04d}-{v.month:02d}-{v.day:02d}T{v.hour:02d}:{v.minute:02d}:{v.second:02d}"
        return text[: {"D": 10, "h": 13, "m": 16, "s": 19}[unit]]
    return str(value)


def check_time(values: Any) -> None:
    """Refuse a time axis with a missing value (NaT), or one that repeats a value or goes back
    (any calendar, or plain numbers).

    Raises:
        ValueError: counting the missing times, naming the first repeated one, or saying the axis
            is not increasing.
    """
    values = np.asarray(values)
    # A step with no date (NaT, or NaN in plain numbers) is a missing value, not an order problem.
    if np.issubdtype(values.dtype, np.datetime64) and np.isnat(values).any():
        raise ValueError(f"time holds {int(np.isnat(values).sum())} missing values (NaT)")
    if values.size < 2:
        return
    days = days_since_epoch(values) if is_time(values) else values.astype(np.float64)
    if not np.all(np.isfinite(days)):
        raise ValueError(f"time holds {int(np.sum(~np.isfinite(days)))} missing values (NaN)")
    steps = np.diff(days)
    if np.any(steps == 0):
        raise ValueError(f"duplicate times: {format_time(values[1:][steps == 0][0], 's')} appears more than once")
    if np.any(steps < 0):
        raise ValueError("time is not monotonic (increasing)")


def nearest_step(times: Any, text: str) -> tuple[int, float]:
    """The index of the step of ``times`` nearest the date ``text``, and its distance in steps.

    The distance is in units of the axis' smallest step (1 day for a single step), so a caller can
    refuse a date far outside the axis.
    """
    times = np.asarray(times)
    wanted = days_since_epoch(np.asarray([parse_time(text, times)], dtype=times.dtype))[0]
    days = days_since_epoch(times)
    gap = np.abs(days - wanted)
    step = float(np.diff(days).min()) if days.size > 1 else 1.0
    best = int(np.argmin(gap))
    return best, float(gap[best] / step)
