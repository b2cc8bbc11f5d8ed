"""Reading the one diagnosis every live rank prints when a collective fails
(custom_ops/health/fault_report.h), whatever the phase the fault hit."""

import collections
import re

Report = collections.namedtuple("Report", "when host phase states text")

# [keras_ddl] at unix time T: rank R on HOST lost contact in PHASE (WHAT).
# [Unreachable: rank(s) [..]: rank P on HOSTP STATE: why; .... ] ...
# keras_ddl ends this process now (exit code 70) ... (rank R)
REPORT = re.compile(r"^\[keras_ddl\] at unix time ([\d.]+): rank (\d+) on (\S+) lost contact in "
                    r"(negotiation|a data transfer|the shutdown exchange) \(.*?\)\. (.*)"
                    r"keras_ddl ends this process now \(exit code 70\) so that the job ends "
                    r"instead of hanging \(rank (\d+)\)$", re.MULTILINE)
PHASES = ("negotiation", "a data transfer")


def fault_reports(text):
    """{rank: Report}, with `states` {peer: 'gone'|'stopped'|'unreachable'}
    as the rank saw them (only ranks that did not answer its probe)."""
    found = {}
    for m in REPORT.finditer(text):
        when, rank, host, phase, body, where = m.groups()
        assert rank == where, m.group(0)
        states = {}
        listed = re.match(r"Unreachable: rank\(s\) \[([\d, ]+)\]: (.*)", body)
        if listed:
            states = {int(p): s for p, s in
                      re.findall(r"rank (\d+) on \S+ (gone|stopped|unreachable):", listed.group(2))}
            assert set(states) == {int(p) for p in listed.group(1).split(",")}, m.group(0)
        found[int(rank)] = Report(float(when), host, phase, states, m.group(0))
    return found
