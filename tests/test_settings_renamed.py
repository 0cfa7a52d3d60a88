"""A renamed setting keeps working under its old name for one minor version, with a
SluiceDeprecationWarning that names the new one (core.conf.RENAMED), from the environment
and from a Django settings file alike; the new name wins when both are set."""
from __future__ import annotations

import pytest
from django.test import override_settings

from core import conf
from core.conf import SluiceDeprecationWarning, from_environ, get_settings


@pytest.fixture
def renamed(monkeypatch):
    monkeypatch.setitem(conf.RENAMED, "WORKERS_PER_QUEUE", ("CONCURRENCY", "0.3"))


def test_an_old_environment_name_still_works_with_a_warning(renamed):
    with pytest.warns(SluiceDeprecationWarning, match=r"SLUICE_WORKERS_PER_QUEUE is renamed SLUICE_CONCURRENCY; "
                                                      r"the old name stops working in Sluice 0\.3"):
        options = from_environ({"SLUICE_WORKERS_PER_QUEUE": "7"})
    assert options == {"SLUICE_CONCURRENCY": 7}


def test_the_new_environment_name_wins_over_the_old(renamed):
    with pytest.warns(SluiceDeprecationWarning):
        options = from_environ({"SLUICE_WORKERS_PER_QUEUE": "7", "SLUICE_CONCURRENCY": "3"})
    assert options == {"SLUICE_CONCURRENCY": 3}


def test_an_old_name_in_a_settings_file_still_works_with_a_warning(renamed):
    with override_settings(SLUICE_WORKERS_PER_QUEUE=9):
        with pytest.warns(SluiceDeprecationWarning, match="SLUICE_CONCURRENCY"):
            assert get_settings().CONCURRENCY == 9

