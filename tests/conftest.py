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


def pytest_sessionstart(session):
    """Start what waits on the network for long, once, in the process that runs the session (not
    in each of make test's worker processes), when the run includes its test."""
    from pathlib import Path

    if hasattr(session.config, "workerinput"):
        return
    deploy = Path(__file__).parent / "deploy"
    targets = [Path(a.split("::")[0]).resolve() for a in session.config.args] or [deploy]
    if any(deploy.is_relative_to(t) or t.is_relative_to(deploy) for t in targets):
        from tests.deploy.test_image import start_resolving

        start_resolving()


# the slowest folders first: `make test`'s processes take files in this order, so the quick unit
# files fill the end instead of one process running the last server case alone
FOLDER_ORDER = ("e2e", "builder", "bench", "deploy", "unit")


def pytest_collection_modifyitems(items):
    def folder(item) -> int:
        parts = item.nodeid.split("/")
        return FOLDER_ORDER.index(parts[1]) if len(parts) > 2 and parts[1] in FOLDER_ORDER else 0

    items.sort(key=folder)
