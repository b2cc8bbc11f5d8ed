"""Link rates as ``tc`` writes them ('100mbit', '1gbit'), for the scaling
model and the test cluster alike. Standard library only, so the scaling
model runs without TensorFlow."""

RATE_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def parse_rate(text):
    """'100mbit', '1gbit', '2.5gbit' (any case) -> bits per second.

    Raises ValueError naming the text unless it is a positive number
    followed by kbit, mbit or gbit.
    """
    t = str(text).strip().lower()
    for unit, scale in RATE_UNITS.items():
        if t.endswith(unit):
            try:
                value = float(t[: -len(unit)])
            except ValueError:
                break
            if value > 0:
                return value * scale
    raise ValueError(f"rate={text!r}: expected a positive number with kbit, mbit or gbit "
                     "(e.g. 100mbit, 1gbit)")


SIZE_UNITS = {"kb": 1 << 10, "mb": 1 << 20, "k": 1 << 10, "m": 1 << 20, "b": 1}


def parse_size(text, what="burst"):
    """'64kb', '64k', '1mb', '65536' (any case) -> bytes (binary units).

    Raises ValueError naming ``what`` and the text unless it is a positive
    whole number of bytes, optionally followed by b, k/kb or m/mb.
    """
    t = str(text).strip().lower()
    scale = 1
    for unit, unit_scale in SIZE_UNITS.items():
        if t.endswith(unit):
            t, scale = t[: -len(unit)], unit_scale
            break
    try:
        value = float(t) * scale
    except ValueError:
        value = 0
    if value >= 1 and value == int(value):
        return int(value)
    raise ValueError(f"{what}={text!r}: expected a positive number of bytes, optionally with "
                     "k or m (e.g. 64k, 256kb, 1mb)")
