"""Invalid DDL_* environment values: a clear error on every rank, no hang."""

import pytest
from launching import case_names


@pytest.mark.parametrize("name", case_names("bad_config.py"))
def test_bad_value_fails_on_every_rank(launcher, name):
    launcher.cases(3, "bad_config.py").check(name)


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", case_names("differing_config.py"))
def test_settings_that_differ_between_ranks_fail_on_every_rank(launcher, name, ranks):
    """Only the last rank's value differs (rank 1 of 2, rank 2 of 3): every
    rank fails at init naming the setting and each rank's value."""
    launcher.cases(ranks, "differing_config.py").check(name)
