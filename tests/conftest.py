"""What several kinds of tests share: the session's ``launcher`` (tests/
launching.py), used by tests/mpi and tests/cluster. Having this file at the
top of tests/ also puts tests/ on sys.path, so test files of every folder
import the shared helpers (launching, fault_reports, image_tree) by name.
Fixtures that only one kind's files share are in that kind's conftest.py
(tests/cluster/conftest.py)."""

import pytest

from launching import Launcher


@pytest.fixture(scope="session")
def launcher():
    """The session's Launcher (its clusters are torn down at the end)."""
    launcher = Launcher()
    yield launcher
    launcher.close()
