import os

from hypothesis import HealthCheck, settings

# CI runs on two shared cores: bounded examples, no deadline (timing belongs in benchmarks)
settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=60, deadline=None)
# HYPOTHESIS_PROFILE=thorough: ten times the examples, for a change to the planner
settings.register_profile(
    "thorough", max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_finish(session):
    """Start what waits on the network for long, so that it runs beside the tests before it."""
    if any("test_image_requirements_resolve" in item.nodeid for item in session.items):
        from tests.deploy.test_image import start_resolving

        start_resolving()
