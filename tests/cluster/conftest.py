"""What the tests of tests/cluster share: ``needs_netns``, the skip of a
test that builds its own network-namespace cluster on a machine that cannot
(not root, or no ip / tc), with the reason. A test that asks the session's
launcher for a cluster (``launcher.cluster``) is skipped the same way there."""

import pytest

from keras_ddl_tools.cluster import missing_requirements


@pytest.fixture
def needs_netns():
    """Skips the test, naming what is missing, unless this machine can build
    the network-namespace test cluster."""
    reason = missing_requirements()
    if reason:
        pytest.skip(f"the network-namespace test cluster needs root, ip and tc: {reason}")
