"""Makes inferlab's lab plugin active for every lab folder: `pytest labs/00_roofline` grades the
starter, `pytest labs/00_roofline --reference` grades inferlab's own implementation."""
from inferlab.labkit import (  # noqa: F401  (pytest finds hooks by name in this module)
    pytest_addoption,
    pytest_collectreport,
    pytest_configure,
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_sessionfinish,
)
