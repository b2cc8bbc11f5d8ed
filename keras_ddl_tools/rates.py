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
