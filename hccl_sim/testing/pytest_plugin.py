"""The pytest plugin of fault suites (registered by hccl-sim's `pytest11` entry point, so installing
hccl-sim is all it takes).

    @pytest.mark.hccl_chaos(kinds=None, max_faults=2,
                            allow=("E_REMOTE", "E_TIMEOUT", "E_OPRETRY_FAIL", "E_MEMORY"), check=None)
    def test_my_recovery():
        results = hccl_sim.run(step, topology=..., env=...)     # as the test always did
        ...

    pytest --hccl-chaos 200 [--hccl-seed 7] [--hccl-report chaos.json]
    pytest tests/test_x.py::test_my_recovery --hccl-replay hcc1-...

Without --hccl-chaos a marked test runs once, as it is. With it, the test runs fault-free (the
twin), then under N scenarios aimed at the calls the twin made (hccl_sim.testing.explore); it
fails on a WRONG, HANG or LEAK scenario, or an error whose code `allow` does not list, and the
failure is shrunk and reported with its plan as YAML and the line that replays it. Each marked
test prints a summary line; --hccl-report writes every test's scenarios and failures as JSON.
"""
from __future__ import annotations

import json

import pytest

MARK = "hccl_chaos"
MARK_ARGS = ("kinds", "max_faults", "allow", "check")


class _State:
    """What the plugin keeps for a pytest session: the reports and summary lines of its tests."""

    def __init__(self):
        self.reports, self.lines = [], []


STATE = pytest.StashKey[_State]()


def pytest_addoption(parser):
    group = parser.getgroup("hccl-chaos", "fault suites of hccl-sim runs (hccl_sim.testing)")
    group.addoption("--hccl-chaos", type=int, default=None, metavar="N",
                    help="run each test marked hccl_chaos under N seeded fault scenarios and its fault-free twin")
    group.addoption("--hccl-seed", type=int, default=0, metavar="S", help="the scenarios' seed (default 0)")
    group.addoption("--hccl-replay", default=None, metavar="TOKEN",
                    help="rerun the one scenario of a replay token on the test it names")
    group.addoption("--hccl-report", default=None, metavar="FILE", help="write the fault suites' outcomes as JSON")
    group.addoption("--hccl-no-shrink", action="store_true", help="report a failure as found, without shrinking it")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{MARK}(kinds=None, max_faults=2, allow=('E_REMOTE', 'E_TIMEOUT', "
                            "'E_OPRETRY_FAIL', 'E_MEMORY'), check=None): run the test under hccl-sim fault scenarios with "
                            "--hccl-chaos N (hccl_sim.testing)")
    n = config.getoption("--hccl-chaos")
    if n is not None and n < 1:
        raise pytest.UsageError(f"--hccl-chaos N: N must be a positive number of scenarios, got {n}")
    config.stash[STATE] = _State()


def _mark_args(item):
    """The marker's arguments, checked (a collection error names a bad one)."""
    mark = item.get_closest_marker(MARK)
    if mark is None:
        return None
    if mark.args:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARK} takes keyword arguments only "
                                f"({', '.join(MARK_ARGS)})")
    unknown = sorted(set(mark.kwargs) - set(MARK_ARGS))
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARK} has no argument {', '.join(unknown)} "
                                f"(it takes {', '.join(MARK_ARGS)})")
    from topologies.errors import HcclError

    from .scenarios import check_kinds
    from .verdict import DEFAULT_ALLOW
    args = {"kinds": None, "max_faults": 2, "allow": DEFAULT_ALLOW, "check": None, **mark.kwargs}
    try:
        args["kinds"] = check_kinds(args["kinds"])
    except HcclError as exc:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARK}: {exc.reason}") from None
    if isinstance(args["allow"], str):
        args["allow"] = (args["allow"],)
    known = _codes()
    bad = [c for c in args["allow"] if c not in known]
    if bad:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARK}: allow names unknown error code(s) {bad}")
    m = args["max_faults"]
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARK}: max_faults must be a positive integer, got {m!r}")
    if args["check"] is not None and not callable(args["check"]):
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARK}: check must be callable(results, twin_results)")
    return args


def _codes():
    from topologies.errors import HCCL_RESULT
    return set(HCCL_RESULT)


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        _mark_args(item)            # a bad marker is an error before anything runs
    if config.getoption("--hccl-replay") is not None:
        marked = [i for i in items if i.get_closest_marker(MARK) is not None]
        if len(marked) != 1:
            raise pytest.UsageError(f"--hccl-replay reruns one marked test: select it by its node id "
                                    f"({len(marked)} marked tests are selected)")
        from topologies.errors import HcclError

        from .token import decode
        try:
            decode(config.getoption("--hccl-replay"), marked[0].nodeid)
        except HcclError as exc:
            raise pytest.UsageError(f"--hccl-replay: {exc.reason}") from None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    config = pyfuncitem.config
    n, token = config.getoption("--hccl-chaos"), config.getoption("--hccl-replay")
    args = _mark_args(pyfuncitem)
    if args is None or (n is None and token is None):
        return None                 # runs as it is
    from .explore import FAILING, explore, replay
    funcargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    def body():
        return pyfuncitem.obj(**funcargs)
    nodeid = pyfuncitem.nodeid
    if token is not None:
        scenario = replay(body, token, nodeid, args["allow"], args["check"])
        line = f"hccl-chaos {nodeid}: replay: {scenario.outcome} ({scenario.words})"
        _say(config, line)
        if scenario.outcome in FAILING:
            pytest.fail(f"{line}\n{scenario.verdict.detail}\nplan:\n{_yaml(scenario.plan)}", pytrace=False)
        return True
    report = explore(body, nodeid, n, config.getoption("--hccl-seed"), args["kinds"], args["max_faults"],
                             args["allow"], args["check"], shrink=not config.getoption("--hccl-no-shrink"))
    config.stash[STATE].reports.append(report)
    _say(config, report.summary())
    if report.failed:
        shrunk = report.shrunk or report.failure
        pytest.fail(
            f"{report.summary()}\nfirst failure (scenario {len(report.scenarios) - 1}): {report.failure.outcome}: "
            f"{report.failure.verdict.detail}\n  plan: {report.failure.words}\n"
            f"shrunk in {report.shrink_runs} runs to: {shrunk.outcome}: {shrunk.verdict.detail}\n"
            f"plan:\n{_yaml(shrunk.plan)}replay: pytest {nodeid} --hccl-replay {report.token}", pytrace=False)
    return True


def _yaml(plan) -> str:
    import yaml
    text = yaml.safe_dump(plan.to_dict(), sort_keys=False, default_flow_style=None)
    return "".join(f"  {line}\n" for line in text.splitlines())


def _say(config, line):
    config.stash[STATE].lines.append(line)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = config.stash[STATE].lines if STATE in config.stash else []
    if lines:
        terminalreporter.section("hccl-chaos")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_unconfigure(config):
    path = config.getoption("--hccl-report", None)
    reports = config.stash[STATE].reports if STATE in config.stash else None
    if path and reports is not None:
        with open(path, "w") as f:
            json.dump({"seed": config.getoption("--hccl-seed"), "tests": [r.to_dict() for r in reports]}, f, indent=1)
