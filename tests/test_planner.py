"""The structured_profile pass planner (jobs/planner.py), without Redis and without sleeping.

Every time is an explicit ``now``. A small in-memory "world" plays the caller: it lists the users
behind in each namespace for a scan and reports build outcomes, so whole passes (and runs of
passes) can be driven and checked against the rules of seed 000, bullets Staleness and Passes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from jobs.planner import (
    BuildStep,
    Decision,
    NamespaceBackoff,
    NamespaceInfo,
    Outcome,
    PassPlanner,
    PlannerSettings,
    PlannerState,
    Reason,
    Refusal,
    ScanList,
    ScanNeeded,
    ScanStep,
    UserCandidate,
    UserWait,
    next_backoff,
    plan_pass,
    refusal_fingerprint,
    rotation_order,
    state_for_generation,
    user_due,
)

T0 = 1_800_000_000.0
SETTINGS = PlannerSettings()
FP = "fingerprint-1"


def ns(name: str, sha: str = "sha-1", parses: bool = True) -> NamespaceInfo:
    return NamespaceInfo(name, sha, parses)


@dataclass
class World:
    """The caller's side: users behind per namespace (listed in id order) and build outcomes."""

    behind: dict[str, list[str]] = field(default_factory=dict)
    outcome: Callable[[str, str], Outcome] = lambda _ns, _user: Outcome.BUILT
    scans: list[ScanStep] = field(default_factory=list)
    builds: list[tuple[str, str]] = field(default_factory=list)
    failing_scans: set[str] = field(default_factory=set)

    def scan(self, step: ScanStep) -> list[str]:
        self.scans.append(step)
        users = sorted(self.behind.get(step.namespace, []))
        return [user for user in users if user not in step.excluded][: step.limit]

    def drive(
        self,
        planner: PassPlanner,
        now: float,
        tick: Callable[[], float] = lambda: 0.0,
    ) -> tuple[list[tuple[str, str]], float]:
        """Run the pass to its end; ``tick`` is how far the clock moves after each step."""
        taken: list[tuple[str, str]] = []
        while (step := planner.next_step(now)) is not None:
            if isinstance(step, ScanStep):
                if step.namespace in self.failing_scans:
                    planner.record_scan_failure(step.namespace, now)
                else:
                    planner.record_scan(step.namespace, self.scan(step), now)
            else:
                assert isinstance(step, BuildStep)
                pair = (step.namespace, step.user_id)
                taken.append(pair)
                self.builds.append(pair)
                outcome = self.outcome(*pair)
                if outcome in (Outcome.BUILT, Outcome.UNCHANGED, Outcome.REFUSED, Outcome.CUT_OFF):
                    # A refused user is no longer behind for this fake: only a change would
                    # list it again, and the fake makes none.
                    listed = self.behind.get(step.namespace, [])
                    if step.user_id in listed:
                        listed.remove(step.user_id)
                planner.record_result(step.namespace, step.user_id, outcome, now, FP)
            now += tick()
        return taken, now


def users(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(count)]


def run_pass(
    state: PlannerState,
    namespaces: list[NamespaceInfo],
    world: World,
    now: float,
    settings: PlannerSettings = SETTINGS,
) -> tuple[PlannerState, float, list[tuple[str, str]], PassPlanner]:
    planner = PassPlanner(state, namespaces, settings, now)
    taken, end = world.drive(planner, now)
    new_state, delay = planner.finish(end)
    return new_state, delay, taken, planner


# --------------------------------------------------------------------------------------------
# Settings and backoff


def test_settings_defaults_are_the_seeds() -> None:
    assert SETTINGS == PlannerSettings(
        max_users_per_pass=20,
        max_pass_seconds=600,
        scan_max_age_seconds=600,
        idle_interval_seconds=600,
        interval_seconds=60,
        cooldown_seconds=600,
        backoff_base_seconds=300,
        backoff_cap_seconds=21600,
        refusal_retry_seconds=21600,
    )


def test_settings_read_from_app_settings_attributes() -> None:
    app_settings = SimpleNamespace(
        structured_profile_max_users_per_pass=5,
        structured_profile_cooldown_seconds=30,
        structured_profile_memory_limit=100,  # not the planner's: ignored
    )
    planner_settings = PlannerSettings.from_settings(app_settings)
    assert planner_settings.max_users_per_pass == 5
    assert planner_settings.cooldown_seconds == 30
    assert planner_settings.backoff_cap_seconds == 21600  # missing: the seed's default


def test_every_planner_setting_is_a_declared_loom_setting() -> None:
    app_settings = pytest.importorskip("app.settings")
    declared = {setting.name: setting for setting in app_settings.SETTINGS}
    values = {}
    for name in PlannerSettings.__dataclass_fields__:
        setting = declared[f"LOOM_STRUCTURED_PROFILE_{name.upper()}"]
        assert float(setting.default) == getattr(SETTINGS, name), name
        values[setting.attr] = setting.parse(setting.default)
    assert PlannerSettings.from_settings(app_settings.Settings(**values)) == SETTINGS


@pytest.mark.parametrize(
    "changes", [{"max_users_per_pass": 0}, {"cooldown_seconds": -1}, {"backoff_cap_seconds": -5}]
)
def test_settings_refuse_impossible_values(changes: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        PlannerSettings(**changes)


@pytest.mark.parametrize(
    ("failures", "wait"),
    [(1, 300), (2, 600), (3, 1200), (4, 2400), (5, 4800), (6, 9600), (7, 19200), (8, 21600)],
)
def test_backoff_doubles_from_base_to_cap(failures: int, wait: int) -> None:
    assert next_backoff(failures) == wait


def test_backoff_of_a_huge_count_is_the_cap() -> None:
    assert next_backoff(10**9) == 21600


def test_backoff_uses_the_given_settings() -> None:
    assert next_backoff(3, PlannerSettings(backoff_base_seconds=10, backoff_cap_seconds=35)) == 35


def test_backoff_needs_a_failure() -> None:
    with pytest.raises(ValueError):
        next_backoff(0)


@given(st.integers(min_value=1, max_value=200))
def test_backoff_never_passes_the_cap_and_doubles(failures: int) -> None:
    wait = next_backoff(failures)
    assert SETTINGS.backoff_base_seconds <= wait <= SETTINGS.backoff_cap_seconds
    assert next_backoff(failures + 1) == min(2 * wait, SETTINGS.backoff_cap_seconds)


@given(
    st.integers(min_value=1, max_value=100),
    st.integers(min_value=1, max_value=10_000),
    st.integers(min_value=0, max_value=100_000),
)
def test_backoff_formula_holds_for_any_settings(failures: int, base: int, cap: int) -> None:
    cfg = PlannerSettings(backoff_base_seconds=base, backoff_cap_seconds=cap)
    assert next_backoff(failures, cfg) == min(base * 2 ** (failures - 1), cap)


# --------------------------------------------------------------------------------------------
# One user's staleness


def built_user(**changes: object) -> UserCandidate:
    """A user built at T0 with nothing changed since, unless told otherwise."""
    values: dict[str, object] = {
        "user_id": "u",
        "changed_at": T0 - 100,
        "built": True,
        "built_at": T0,
        "fingerprint": FP,
    }
    values.update(changes)
    return UserCandidate(**values)  # type: ignore[arg-type]


def test_decision_is_truthy_only_when_due() -> None:
    assert Decision(True, Reason.PENDING)
    assert not Decision(False, Reason.CURRENT)


def test_a_user_never_built_is_due_at_once() -> None:
    decision = user_due(UserCandidate("u", changed_at=T0), T0, SETTINGS)
    assert decision == Decision(True, Reason.PENDING)


def test_a_pending_user_without_any_change_is_still_due() -> None:
    # An expired or redacted row reads as no profile and is rebuilt.
    assert user_due(UserCandidate("u", built_at=T0), T0 + 1, SETTINGS).reason is Reason.PENDING


def test_a_user_with_nothing_changed_since_the_build_is_current() -> None:
    decision = user_due(built_user(), T0 + 10**6, SETTINGS)
    assert decision == Decision(False, Reason.CURRENT)


def test_a_change_waits_the_cooldown_counted_from_the_change() -> None:
    candidate = built_user(changed_at=T0 + 5000)
    assert user_due(candidate, T0 + 5000, SETTINGS) == Decision(False, Reason.COOLDOWN, T0 + 5600)
    assert not user_due(candidate, T0 + 5599.9, SETTINGS)
    assert user_due(candidate, T0 + 5600, SETTINGS) == Decision(True, Reason.COOLED)


def test_a_later_change_restarts_the_cooldown() -> None:
    # A burst of edits (or restatements) costs one rebuild, after the burst.
    assert not user_due(built_user(changed_at=T0 + 900), T0 + 1000, SETTINGS)
    assert user_due(built_user(changed_at=T0 + 900), T0 + 1500, SETTINGS)


def test_a_change_right_after_a_build_waits_the_cooldown_from_the_change() -> None:
    decision = user_due(built_user(changed_at=T0 + 1), T0 + 2, SETTINGS)
    assert decision.not_before == T0 + 601


def test_a_short_build_is_built_again_after_each_cooldown_without_a_change() -> None:
    candidate = built_user(short=True)
    assert user_due(candidate, T0 + 599, SETTINGS) == Decision(False, Reason.COOLDOWN, T0 + 600)
    assert user_due(candidate, T0 + 600, SETTINGS).reason is Reason.COOLED


def test_a_short_build_that_wrote_nothing_for_a_pending_user_waits_the_cooldown() -> None:
    # None of the counted facts was served and no row exists: nothing was written, and the
    # next try waits a cooldown like any short build instead of spending every pass on it.
    candidate = UserCandidate("u", changed_at=T0 - 50, built=False, built_at=T0, short=True)
    assert user_due(candidate, T0 + 10, SETTINGS).reason is Reason.COOLDOWN
    assert user_due(candidate, T0 + 600, SETTINGS).due


def test_a_short_build_without_any_date_is_due() -> None:
    assert user_due(UserCandidate("u", built=True, short=True), T0, SETTINGS).due


def test_a_deletion_skips_the_cooldown() -> None:
    candidate = built_user(changed_at=T0 + 10, deletion=True)
    assert user_due(candidate, T0 + 11, SETTINGS) == Decision(True, Reason.DELETION)


def test_a_schema_change_is_due_from_the_next_pass_without_cooldown() -> None:
    candidate = built_user(changed_at=T0 + 10, schema_changed=True)
    assert user_due(candidate, T0 + 11, SETTINGS) == Decision(True, Reason.SCHEMA)


def test_a_backoff_holds_even_a_deletion_or_a_schema_change() -> None:
    candidate = built_user(deletion=True, schema_changed=True, backoff_until=T0 + 300)
    assert user_due(candidate, T0 + 299, SETTINGS) == Decision(False, Reason.BACKOFF, T0 + 300)
    assert user_due(candidate, T0 + 300, SETTINGS).due


def test_a_refusal_holds_while_nothing_it_depends_on_changes() -> None:
    candidate = built_user(changed_at=T0 + 1, refusal=Refusal(T0 + 2, FP), fingerprint=FP)
    decision = user_due(candidate, T0 + 10_000, SETTINGS)
    assert decision == Decision(False, Reason.REFUSED, T0 + 2 + 21600)


def test_a_refusal_is_retried_when_its_fingerprint_changes() -> None:
    candidate = built_user(refusal=Refusal(T0, FP), fingerprint="other", schema_changed=True)
    assert user_due(candidate, T0 + 1, SETTINGS).reason is Reason.SCHEMA


def test_a_refusal_is_retried_after_the_refusal_retry_time() -> None:
    # A lock that lapses on its own changes nothing the fingerprint sees.
    candidate = UserCandidate("u", built=False, refusal=Refusal(T0, FP), fingerprint=FP)
    assert not user_due(candidate, T0 + 21599, SETTINGS)
    assert user_due(candidate, T0 + 21600, SETTINGS).reason is Reason.PENDING


def test_a_zero_cooldown_rebuilds_at_the_next_pass() -> None:
    cfg = PlannerSettings(cooldown_seconds=0)
    assert user_due(built_user(changed_at=T0 + 5), T0 + 5, cfg).due


def test_refusal_fingerprint_moves_with_each_part() -> None:
    base = refusal_fingerprint("digest", 7, "sha")
    assert base == refusal_fingerprint("digest", "7", "sha")
    assert (
        len(
            {
                base,
                refusal_fingerprint("digest2", 7, "sha"),
                refusal_fingerprint("digest", 8, "sha"),
                refusal_fingerprint("digest", 7, "sha2"),
                refusal_fingerprint("digest", None, "sha"),
            }
        )
        == 5
    )


# --------------------------------------------------------------------------------------------
# State, JSON and lease generations


def full_state() -> PlannerState:
    return PlannerState(
        generation=7,
        cursor="acme/b",
        scans={"acme/a": ScanList(["u1", "u2"], T0, "sha-1", False)},
        namespace_backoffs={"acme/c": NamespaceBackoff(2, T0 + 600, "sha-3")},
        user_waits={
            "acme/a": {
                "u3": UserWait(1, T0 + 300, None),
                "u4": UserWait(0, None, Refusal(T0 - 5, FP)),
            }
        },
    )


def test_state_round_trips_through_json() -> None:
    state = full_state()
    text = state.to_json()
    assert json.loads(text)["format"] == 1
    assert PlannerState.from_json(text) == state
    assert PlannerState.from_dict(state.to_dict()) == state


def test_an_empty_dict_is_not_a_state() -> None:
    with pytest.raises(ValueError):
        PlannerState.from_dict({})


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(format=99),
        lambda d: d.update(generation=[1]),
        lambda d: d.update(generation=True),
        lambda d: d.update(cursor=3),
        lambda d: d["scans"]["acme/a"].update(users="u1"),
        lambda d: d["scans"]["acme/a"].update(created_at="soon"),
        lambda d: d["scans"]["acme/a"].update(complete=1),
        lambda d: d["namespace_backoffs"]["acme/c"].update(failures=-1),
        lambda d: d["namespace_backoffs"]["acme/c"].update(until=True),
        lambda d: d["user_waits"]["acme/a"].update(u3=[]),
        lambda d: d["user_waits"]["acme/a"]["u4"].update(refusal={"refused_at": 1}),
    ],
)
def test_a_malformed_state_is_refused(mutate: Callable[[dict], object]) -> None:
    data = full_state().to_dict()
    mutate(data)
    with pytest.raises(ValueError):
        PlannerState.from_dict(data)


def test_bad_json_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        PlannerState.from_json("{not json")


def test_a_nan_time_is_not_stored() -> None:
    state = PlannerState(scans={"a": ScanList([], math.nan, "s", True)})
    with pytest.raises(ValueError):
        state.to_json()


def test_copy_is_deep() -> None:
    state = full_state()
    copy = state.copy()
    copy.scans["acme/a"].users.append("u9")
    copy.user_waits["acme/a"]["u3"].failures = 5
    assert state == full_state()


def test_the_same_generation_keeps_the_stored_state() -> None:
    state = full_state()
    assert state_for_generation(state, 7) is state


def test_another_generation_starts_over_but_keeps_the_rotation() -> None:
    fresh = state_for_generation(full_state(), 8)
    assert fresh == PlannerState(generation=8, cursor="acme/b")


def test_no_stored_state_starts_fresh() -> None:
    assert state_for_generation(None, "g1") == PlannerState(generation="g1")


finite_times = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)
times = st.one_of(finite_times, st.integers(min_value=-(10**12), max_value=10**12))
names = st.text(min_size=1, max_size=12)
optional_refusals = st.none() | st.builds(Refusal, times, st.text(max_size=20))
states = st.builds(
    PlannerState,
    generation=st.none() | st.text(max_size=10) | st.integers(min_value=0, max_value=2**62),
    cursor=st.none() | names,
    scans=st.dictionaries(
        names,
        st.builds(ScanList, st.lists(names, max_size=5), times, st.text(max_size=8), st.booleans()),
        max_size=4,
    ),
    namespace_backoffs=st.dictionaries(
        names,
        st.builds(
            NamespaceBackoff, st.integers(min_value=0, max_value=60), times, st.text(max_size=8)
        ),
        max_size=4,
    ),
    user_waits=st.dictionaries(
        names,
        st.dictionaries(
            names,
            st.builds(
                UserWait,
                st.integers(min_value=0, max_value=60),
                st.none() | times,
                optional_refusals,
            ),
            max_size=4,
        ),
        max_size=3,
    ),
)


@given(states)
def test_json_round_trip_is_identity(state: PlannerState) -> None:
    again = PlannerState.from_json(state.to_json())
    assert again == state
    assert again.to_json() == state.to_json()


# --------------------------------------------------------------------------------------------
# Rotation


def test_rotation_is_sorted_and_starts_after_the_cursor() -> None:
    assert rotation_order(["c", "a", "b"], None) == ["a", "b", "c"]
    assert rotation_order(["c", "a", "b"], "a") == ["b", "c", "a"]
    assert rotation_order(["c", "a", "b"], "c") == ["a", "b", "c"]


def test_rotation_continues_after_a_cursor_that_left() -> None:
    assert rotation_order(["a", "c", "d"], "b") == ["c", "d", "a"]


def test_a_pass_continues_the_rotation_where_the_last_one_stopped() -> None:
    # Five namespaces, a budget of two: one user each, two namespaces a pass.
    cfg = PlannerSettings(max_users_per_pass=2)
    spaces = [ns(name) for name in "abcde"]
    world = World(behind={name: users(name, 5) for name in "abcde"})
    state = PlannerState()
    served = []
    for i in range(3):
        state, delay, taken, planner = run_pass(state, spaces, world, T0 + 60 * i, cfg)
        assert planner.share == 1
        served.append([space for space, _ in taken])
        assert delay == 60
    assert served == [["a", "b"], ["c", "d"], ["e", "a"]]
    assert state.cursor == "a"


def test_namespaces_in_order_leaves_out_the_waiting_ones() -> None:
    state = PlannerState(
        cursor="b", namespace_backoffs={"c": NamespaceBackoff(1, T0 + 10, "sha-1")}
    )
    planner = PassPlanner(state, [ns("a"), ns("b"), ns("c"), ns("d")], SETTINGS, T0)
    assert planner.namespaces_in_order() == ["d", "a", "b"]
    assert planner.share == 6


def test_a_namespace_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError):
        PassPlanner(PlannerState(), [ns("a"), ns("a")], SETTINGS, T0)


def test_plan_pass_starts_a_planner() -> None:
    planner = plan_pass(PlannerState(), [ns("a")], T0, SETTINGS)
    assert isinstance(planner, PassPlanner)
    assert planner.started_at == T0


# --------------------------------------------------------------------------------------------
# Shares and leftovers


def test_equal_shares_round_down_and_the_remainder_goes_to_full_namespaces() -> None:
    # 20 // 3 = 6 each; the 2 left over go round the namespaces that used their whole share.
    world = World(behind={"a": users("a", 30), "b": users("b", 2), "c": users("c", 30)})
    _, _, taken, planner = run_pass(PlannerState(), [ns("a"), ns("b"), ns("c")], world, T0)
    assert planner.share == 6
    counts = {name: sum(1 for space, _ in taken if space == name) for name in "abc"}
    assert counts == {"a": 6 + 3, "b": 2, "c": 6 + 3}
    # First round in rotation order, then one at a time round the full namespaces.
    assert [space for space, _ in taken][:14] == ["a"] * 6 + ["b"] * 2 + ["c"] * 6
    assert [space for space, _ in taken][14:] == ["a", "c", "a", "c", "a", "c"]


def test_a_namespace_with_nothing_to_build_spends_nothing() -> None:
    world = World(behind={"a": [], "b": users("b", 30)})
    _, _, taken, planner = run_pass(PlannerState(), [ns("a"), ns("b")], world, T0)
    assert planner.share == 10
    assert len(taken) == 20
    assert {space for space, _ in taken} == {"b"}


def test_leftovers_come_only_from_users_already_listed() -> None:
    # b's scan asks for 10 * share = 100 and lists its 12 users; the leftover takes the rest of
    # them but never scans again in this pass.
    world = World(behind={"a": users("a", 1), "b": users("b", 12)})
    _, _, taken, _ = run_pass(PlannerState(), [ns("a"), ns("b")], world, T0)
    assert len(taken) == 13
    assert [step.namespace for step in world.scans] == ["a", "b"]


def test_leftover_stops_at_what_the_scan_listed() -> None:
    # Budget 4, two namespaces, share 2, scans of 20. a has one user behind and b 30: round one
    # takes a's one and b's two, round two gives b the one a left; the rest of b's list waits
    # for the next pass.
    cfg = PlannerSettings(max_users_per_pass=4)
    world = World(behind={"a": users("a", 1), "b": users("b", 30)})
    state, delay, taken, planner = run_pass(PlannerState(), [ns("a"), ns("b")], world, T0, cfg)
    assert planner.share == 2
    assert taken == [("a", "a000"), ("b", "b000"), ("b", "b001"), ("b", "b002")]
    assert world.scans[1].limit == 20
    assert len(state.scans["b"].users) == 17
    assert not state.scans["b"].complete
    assert delay == 60


def test_the_budget_is_never_passed() -> None:
    world = World(behind={name: users(name, 50) for name in "abcdefg"})
    _, _, taken, _ = run_pass(PlannerState(), [ns(n) for n in "abcdefg"], world, T0)
    assert len(taken) == 20


def test_more_namespaces_than_budget_take_one_each() -> None:
    cfg = PlannerSettings(max_users_per_pass=3)
    world = World(behind={name: users(name, 5) for name in "abcde"})
    state, _, taken, planner = run_pass(PlannerState(), [ns(n) for n in "abcde"], world, T0, cfg)
    assert planner.share == 1
    assert taken == [("a", "a000"), ("b", "b000"), ("c", "c000")]
    assert state.cursor == "c"
    assert world.scans[0].limit == 10


# --------------------------------------------------------------------------------------------
# Scan lists


def test_a_scan_list_is_used_by_the_next_passes_without_scanning_again() -> None:
    cfg = PlannerSettings(max_users_per_pass=2)
    world = World(behind={"a": users("a", 50)})
    state, _, first, _ = run_pass(PlannerState(), [ns("a")], world, T0, cfg)
    assert first == [("a", "a000"), ("a", "a001")]
    assert state.scans["a"].users == users("a", 20)[2:]
    state, _, second, _ = run_pass(state, [ns("a")], world, T0 + 60, cfg)
    assert second == [("a", "a002"), ("a", "a003")]
    assert len(world.scans) == 1


def test_a_drained_complete_scan_is_not_repeated_before_its_max_age() -> None:
    world = World(behind={"a": users("a", 3)})
    state, delay, taken, _ = run_pass(PlannerState(), [ns("a")], world, T0)
    assert len(taken) == 3 and delay == 60
    assert state.scans["a"] == ScanList([], T0, "sha-1", True)
    world.behind["a"] = ["late"]  # behind since, but the complete scan stands for now
    # It stands while the next pass, one interval (60 s) on, still finds it under its max age.
    state, delay, taken, _ = run_pass(state, [ns("a")], world, T0 + 540)
    assert taken == [] and delay == 600
    assert len(world.scans) == 1
    state, _, taken, _ = run_pass(state, [ns("a")], world, T0 + 540.5)
    assert taken == [("a", "late")]
    assert len(world.scans) == 2


def test_a_wake_since_a_scan_makes_the_next_pass_scan_again() -> None:
    # A user's first source fact (or a schema set) counts a wake in the namespace; a list made
    # at another count is not taken from, complete and drained or not, young or not.
    world = World(behind={"a": users("a", 2), "b": users("b", 1)})
    woken = [NamespaceInfo("a", "sha-1", wakes=1), NamespaceInfo("b", "sha-1", wakes=4)]
    state, delay, taken, _ = run_pass(PlannerState(), woken, world, T0)
    assert len(taken) == 3
    assert state.scans["a"] == ScanList([], T0, "sha-1", True, 1)
    world.behind = {"a": ["new"], "b": ["late"]}
    # "a" was woken again; "b" was not: its complete list stands until its max age.
    again = [NamespaceInfo("a", "sha-1", wakes=2), NamespaceInfo("b", "sha-1", wakes=4)]
    state, delay, taken, _ = run_pass(state, again, world, T0 + 60)
    assert taken == [("a", "new")]
    assert [step.namespace for step in world.scans] == ["a", "b", "a"]
    assert state.scans["a"].wakes == 2
    # A list with users left is made again too: the woken user may be older than some on it.
    state.scans["a"] = ScanList(["x", "y"], T0 + 60, "sha-1", False, 2)
    world.behind["a"] = ["new2", "x", "y"]
    _, _, taken, _ = run_pass(state, [NamespaceInfo("a", "sha-1", wakes=3)], world, T0 + 120)
    assert taken == [("a", "new2"), ("a", "x"), ("a", "y")]


def test_a_scan_list_keeps_its_wake_count_and_one_stored_without_reads_as_none() -> None:
    state = PlannerState(scans={"a": ScanList(["u"], T0, "sha-1", True, 7)})
    assert PlannerState.from_json(state.to_json()).scans["a"].wakes == 7
    older = state.to_dict()
    del older["scans"]["a"]["wakes"]
    assert PlannerState.from_dict(older).scans["a"] == ScanList(["u"], T0, "sha-1", True, 0)
    older["scans"]["a"]["wakes"] = -1
    with pytest.raises(ValueError):
        PlannerState.from_dict(older)


def test_a_drained_incomplete_scan_is_made_again_in_the_same_pass() -> None:
    # The list made earlier holds one user; the namespace's share is 20, so once it drains a
    # new scan fills the share.
    state = PlannerState(scans={"a": ScanList(["a000"], T0, "sha-1", False)})
    world = World(behind={"a": users("a", 5)})
    _, _, taken, _ = run_pass(state, [ns("a")], world, T0 + 10)
    assert taken == [("a", user) for user in users("a", 5)]
    assert len(world.scans) == 1
    assert "a000" in world.scans[0].excluded  # already handed out in this pass


def test_a_scan_list_is_dropped_when_the_schema_changes() -> None:
    state = PlannerState(scans={"a": ScanList(["old"], T0, "sha-1", False)})
    world = World(behind={"a": ["x"]})
    new_state, _, taken, _ = run_pass(state, [ns("a", sha="sha-2")], world, T0 + 10)
    assert taken == [("a", "x")]
    assert new_state.scans["a"].schema_sha == "sha-2"


def test_a_scan_list_is_dropped_at_its_max_age() -> None:
    cfg = PlannerSettings(max_users_per_pass=1)
    state = PlannerState(scans={"a": ScanList(["old"], T0, "sha-1", False)})
    world = World(behind={"a": ["x"]})
    # Dropped once the next pass, one interval (60 s) on, would find it past its max age: a
    # change it missed is then scanned for at most the max age after the list was made.
    _, _, taken, _ = run_pass(state, [ns("a")], world, T0 + 540, cfg)
    assert taken == [("a", "old")]
    _, _, taken, _ = run_pass(state, [ns("a")], world, T0 + 540.5, cfg)
    assert taken == [("a", "x")]


def test_a_scan_longer_than_asked_is_cut_and_incomplete() -> None:
    cfg = PlannerSettings(max_users_per_pass=1)
    planner = PassPlanner(PlannerState(), [ns("a")], cfg, T0)
    step = planner.next_step(T0)
    assert step == ScanStep("a", 10, frozenset())
    planner.record_scan("a", users("a", 15), T0)
    state = planner.snapshot()
    assert state.scans["a"].users == users("a", 10)
    assert not state.scans["a"].complete


def test_a_scan_drops_repeats_and_excluded_users() -> None:
    state = PlannerState(user_waits={"a": {"w": UserWait(1, T0 + 300)}})
    planner = PassPlanner(state, [ns("a")], SETTINGS, T0)
    assert planner.needs_scan("a")
    assert planner.scan_size("a") == 200
    planner.record_scan("a", ["x", "w", "x", "y"], T0)
    assert not planner.needs_scan("a")
    assert planner.snapshot().scans["a"].users == ["x", "y"]


def test_a_scan_step_is_repeated_until_recorded() -> None:
    planner = PassPlanner(PlannerState(), [ns("a")], SETTINGS, T0)
    first = planner.next_step(T0)
    assert isinstance(first, ScanStep)
    assert planner.next_step(T0 + 1) == first


def test_a_listed_user_now_waiting_on_a_backoff_is_skipped() -> None:
    state = PlannerState(
        scans={"a": ScanList(["w", "x"], T0, "sha-1", True)},
        user_waits={"a": {"w": UserWait(1, T0 + 300)}},
    )
    world = World(behind={"a": ["w", "x"]})
    _, _, taken, _ = run_pass(state, [ns("a")], world, T0 + 10)
    assert taken == [("a", "x")]


def test_unknown_namespaces_are_refused_by_the_scan_calls() -> None:
    planner = PassPlanner(PlannerState(), [ns("a")], SETTINGS, T0)
    for call in (
        lambda: planner.scan_size("zz"),
        lambda: planner.needs_scan("zz"),
        lambda: planner.record_scan("zz", [], T0),
        lambda: planner.record_scan_failure("zz", T0),
    ):
        with pytest.raises(ValueError):
            call()


# --------------------------------------------------------------------------------------------
# Time


def test_no_new_user_in_the_second_half_of_the_pass() -> None:
    world = World(behind={"a": users("a", 30)})
    planner = PassPlanner(PlannerState(), [ns("a")], SETTINGS, T0)
    # Every step takes 100 seconds: the scan at 0, builds at 100 and 200; 300 is the second half.
    taken, end = world.drive(planner, T0, tick=lambda: 100.0)
    assert taken == [("a", "a000"), ("a", "a001")]
    assert planner.out_of_time(T0 + 300) and not planner.out_of_time(T0 + 299.999)
    state, delay = planner.finish(end)
    # The users not reached stay listed for the next pass.
    assert state.scans["a"].users[:2] == ["a002", "a003"]
    assert delay == 60


def test_no_scan_in_the_second_half_either() -> None:
    planner = PassPlanner(PlannerState(), [ns("a")], SETTINGS, T0)
    assert planner.next_step(T0 + 300) is None


# --------------------------------------------------------------------------------------------
# Outcomes, user waits and refusals


def fail_all(_ns: str, _user: str) -> Outcome:
    return Outcome.FAILED


def test_a_failed_user_waits_and_is_left_out_of_scans() -> None:
    world = World(behind={"a": ["u"]}, outcome=fail_all)
    state, _, taken, _ = run_pass(PlannerState(), [ns("a")], world, T0)
    assert taken == [("a", "u")]
    assert state.user_waits["a"]["u"] == UserWait(1, T0 + 300, None)
    # The complete scan is drained; once it ages out the new scan leaves the user out.
    state, _, taken, _ = run_pass(state, [ns("a")], world, T0 + 200)
    assert taken == []
    planner = PassPlanner(state, [ns("a")], SETTINGS, T0 + 299)
    assert planner.excluded_users("a", T0 + 299) == {"u"}
    assert planner.excluded_users("a", T0 + 300) == frozenset()


def test_a_failed_user_is_tried_at_the_first_scan_after_its_wait() -> None:
    world = World(behind={"a": ["u"]}, outcome=fail_all)
    state, _, _, _ = run_pass(PlannerState(), [ns("a")], world, T0)
    state, _, taken, _ = run_pass(state, [ns("a")], world, T0 + 600)  # wait over, scan aged
    assert taken == [("a", "u")]
    # The second failure in a row waits twice as long.
    assert state.user_waits["a"]["u"] == UserWait(2, T0 + 600 + 600, None)


def test_a_build_ends_the_failure_count() -> None:
    state = PlannerState(user_waits={"a": {"u": UserWait(3, T0 - 1)}})
    world = World(behind={"a": ["u"]})
    state, _, taken, _ = run_pass(state, [ns("a")], world, T0)
    assert taken == [("a", "u")]
    assert state.user_waits == {}


@pytest.mark.parametrize("outcome", [Outcome.REFUSED, Outcome.CUT_OFF, "refused", "cut_off"])
def test_a_refusal_is_kept_with_its_fingerprint(outcome: Outcome | str) -> None:
    planner = PassPlanner(PlannerState(), [ns("a")], SETTINGS, T0)
    planner.record_scan("a", ["u"], T0)
    assert planner.next_user(T0) == ("a", "u")
    planner.record_result("a", "u", outcome, T0 + 5, FP)
    state, _ = planner.finish(T0 + 6)
    assert state.user_waits["a"]["u"] == UserWait(0, None, Refusal(T0 + 5, FP))
    later = PassPlanner(state, [ns("a")], SETTINGS, T0 + 100)
    same = UserCandidate("u", changed_at=T0 + 50, built=True, built_at=T0, fingerprint=FP)
    assert later.due("a", same, T0 + 700).reason is Reason.REFUSED
    moved = UserCandidate("u", changed_at=T0 + 50, built=True, built_at=T0, fingerprint="new")
    assert later.due("a", moved, T0 + 700).due
    assert later.due("a", same, T0 + 5 + 21600).due


def test_a_refusal_needs_a_fingerprint() -> None:
    planner = PassPlanner(PlannerState(), [ns("a")], SETTINGS, T0)
    planner.record_scan("a", ["u"], T0)
    planner.next_user(T0)
    with pytest.raises(ValueError):
        planner.record_result("a", "u", Outcome.REFUSED, T0)


def test_a_result_for_a_user_not_handed_out_or_twice_is_refused() -> None:
    planner = PassPlanner(PlannerState(), [ns("a")], SETTINGS, T0)
    planner.record_scan("a", ["u"], T0)
    with pytest.raises(ValueError):
        planner.record_result("a", "u", Outcome.BUILT, T0)
    planner.next_user(T0)
    planner.record_result("a", "u", Outcome.FAILED, T0)
    with pytest.raises(ValueError):
        planner.record_result("a", "u", Outcome.FAILED, T0)


def test_an_unknown_outcome_is_refused() -> None:
    planner = PassPlanner(PlannerState(), [ns("a")], SETTINGS, T0)
    planner.record_scan("a", ["u"], T0)
    planner.next_user(T0)
    with pytest.raises(ValueError):
        planner.record_result("a", "u", "exploded", T0)


def test_due_folds_in_the_planners_backoff() -> None:
    state = PlannerState(user_waits={"a": {"u": UserWait(1, T0 + 300)}})
    planner = PassPlanner(state, [ns("a")], SETTINGS, T0)
    pending = UserCandidate("u")
    assert planner.due("a", pending, T0 + 10) == Decision(False, Reason.BACKOFF, T0 + 300)
    assert planner.due("a", pending, T0 + 300).due
    assert planner.due("b", pending, T0 + 10).due  # another namespace's user of the same id


def test_users_behind_filters_and_orders_a_scan() -> None:
    state = PlannerState(user_waits={"a": {"w": UserWait(1, T0 + 300)}})
    planner = PassPlanner(state, [ns("a")], SETTINGS, T0)
    candidates = [
        UserCandidate("late", changed_at=T0 - 10),
        UserCandidate("w", changed_at=T0 - 5000),  # waiting on a backoff
        UserCandidate("early", changed_at=T0 - 900),
        UserCandidate("fresh", changed_at=T0 - 1, built=True, built_at=T0 - 2000),  # cooling
        UserCandidate("none"),
        UserCandidate("current", changed_at=T0 - 5000, built=True, built_at=T0 - 4000),
    ]
    assert planner.users_behind("a", candidates, T0) == ["none", "early", "late"]


def test_next_user_asks_for_a_scan_first() -> None:
    planner = PassPlanner(PlannerState(), [ns("a")], SETTINGS, T0)
    with pytest.raises(ScanNeeded) as raised:
        planner.next_user(T0)
    assert raised.value.step == ScanStep("a", 200, frozenset())
    planner.record_scan("a", ["u"], T0)
    assert planner.next_user(T0) == ("a", "u")
    assert planner.taken() == [("a", "u")]
    assert planner.budget_left == 19
    assert planner.next_user(T0) is None


# --------------------------------------------------------------------------------------------
# Namespace waits


def test_a_failed_scan_backs_the_namespace_off_and_doubles() -> None:
    world = World(behind={"a": ["u"], "b": ["v"]}, failing_scans={"a"})
    state, delay, taken, _ = run_pass(PlannerState(), [ns("a"), ns("b")], world, T0)
    assert taken == [("b", "v")]
    assert state.namespace_backoffs["a"] == NamespaceBackoff(1, T0 + 300, "sha-1")
    assert delay == 60
    # While it waits it takes no place; after the wait it is scanned again and fails again.
    planner = PassPlanner(state, [ns("a"), ns("b")], SETTINGS, T0 + 299)
    assert planner.namespaces_in_order() == ["b"]
    state, _, _, _ = run_pass(state, [ns("a"), ns("b")], world, T0 + 300)
    assert state.namespace_backoffs["a"] == NamespaceBackoff(2, T0 + 900, "sha-1")
    # A scan that works ends the count.
    world.failing_scans.clear()
    state, _, taken, _ = run_pass(state, [ns("a"), ns("b")], world, T0 + 900)
    assert taken == [("a", "u")]
    assert state.namespace_backoffs == {}


def test_a_schema_change_ends_a_namespace_wait() -> None:
    state = PlannerState(namespace_backoffs={"a": NamespaceBackoff(3, T0 + 5000, "sha-1")})
    planner = PassPlanner(state, [ns("a", sha="sha-2")], SETTINGS, T0)
    assert planner.namespaces_in_order() == ["a"]
    assert planner.snapshot().namespace_backoffs == {}


def test_a_schema_that_no_longer_parses_is_counted_and_waits() -> None:
    broken = [ns("a", parses=False), ns("b")]
    world = World(behind={"a": ["u"], "b": []})
    state, delay, taken, planner = run_pass(PlannerState(), broken, world, T0)
    assert planner.namespaces_in_order() == ["b"]
    assert taken == []
    assert state.namespace_backoffs["a"] == NamespaceBackoff(1, T0 + 300, "sha-1")
    assert delay == 600  # b reached, nobody behind; a waiting namespace takes no part
    # Still broken after the wait: counted again, twice the wait.
    state, _, _, _ = run_pass(state, broken, world, T0 + 300)
    assert state.namespace_backoffs["a"] == NamespaceBackoff(2, T0 + 900, "sha-1")
    # Within the wait it is not counted again.
    state, _, _, _ = run_pass(state, broken, world, T0 + 400)
    assert state.namespace_backoffs["a"].failures == 2


# --------------------------------------------------------------------------------------------
# The end of a pass


def test_a_pass_that_finds_nobody_behind_waits_the_idle_interval() -> None:
    world = World(behind={"a": [], "b": []})
    _, delay, taken, _ = run_pass(PlannerState(), [ns("a"), ns("b")], world, T0)
    assert taken == [] and delay == 600


def test_a_pass_over_no_namespace_is_idle() -> None:
    _, delay, taken, _ = run_pass(PlannerState(), [], World(), T0)
    assert taken == [] and delay == 600


def test_a_pass_that_built_someone_runs_again_at_the_interval() -> None:
    _, delay, _, _ = run_pass(PlannerState(), [ns("a")], World(behind={"a": ["u"]}), T0)
    assert delay == 60


def test_a_pass_that_reached_part_of_the_rotation_runs_again_at_the_interval() -> None:
    planner = PassPlanner(PlannerState(), [ns("a"), ns("b")], SETTINGS, T0)
    planner.record_scan("a", [], T0)
    assert isinstance(planner.next_step(T0), ScanStep)  # b not reached yet
    _, delay = planner.finish(T0)
    assert delay == 60


def test_finish_stores_the_cursor_and_cannot_run_twice() -> None:
    world = World(behind={"a": ["u"], "b": []})
    planner = PassPlanner(PlannerState(generation=4), [ns("a"), ns("b")], SETTINGS, T0)
    world.drive(planner, T0)
    state, _ = planner.finish(T0)
    assert state.cursor == "b" and state.generation == 4
    with pytest.raises(RuntimeError):
        planner.finish(T0)
    with pytest.raises(RuntimeError):
        planner.next_step(T0)


def test_a_pass_leaves_the_callers_state_alone() -> None:
    state = full_state()
    world = World(behind={"acme/a": ["u1", "u2", "z"], "acme/b": ["q"]})
    run_pass(state, [ns("acme/a"), ns("acme/b")], world, T0 + 1)
    assert state == full_state()


def test_state_of_namespaces_without_a_schema_is_dropped() -> None:
    state, _, _, _ = run_pass(full_state(), [ns("acme/z")], World(), T0)
    assert set(state.scans) == {"acme/z"}  # its own (empty, complete) scan
    assert state.namespace_backoffs == {} and state.user_waits == {}


def test_old_waits_are_forgotten() -> None:
    state = PlannerState(
        user_waits={
            "a": {
                "refused": UserWait(0, None, Refusal(T0, FP)),
                "failed": UserWait(4, T0, None),
                "both": UserWait(1, T0 + 30000, Refusal(T0, FP)),
            }
        }
    )
    planner = PassPlanner(state, [ns("a")], SETTINGS, T0 + 21600)
    assert planner.snapshot().user_waits == {"a": {"both": UserWait(1, T0 + 30000, None)}}


def test_snapshot_mid_pass_holds_what_was_recorded() -> None:
    planner = PassPlanner(PlannerState(), [ns("a")], SETTINGS, T0)
    planner.record_scan("a", ["u", "v"], T0)
    user = planner.next_user(T0)
    assert user is not None
    planner.record_result(*user, Outcome.FAILED, T0)
    snap = planner.snapshot()
    assert snap.cursor == "a"
    assert snap.scans["a"].users == ["v"]
    assert snap.user_waits["a"]["u"].failures == 1


# --------------------------------------------------------------------------------------------
# Properties


namespace_names = st.lists(
    st.text(alphabet="abcdefghij", min_size=1, max_size=3), min_size=0, max_size=8, unique=True
)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[str], dict[str, list[str]], int]:
    spaces = draw(namespace_names)
    behind = {
        space: users(f"{space}-", draw(st.integers(min_value=0, max_value=40))) for space in spaces
    }
    budget = draw(st.integers(min_value=1, max_value=25))
    return spaces, behind, budget


@given(worlds())
@hsettings(max_examples=300, deadline=None)
def test_every_namespace_behind_gets_its_share_when_the_budget_allows(
    world_spec: tuple[list[str], dict[str, list[str]], int],
) -> None:
    spaces, behind, budget = world_spec
    cfg = PlannerSettings(max_users_per_pass=budget)
    counts = {space: len(listed) for space, listed in behind.items()}
    world = World(behind={space: list(listed) for space, listed in behind.items()})
    _, _, taken, planner = run_pass(PlannerState(), [ns(s) for s in spaces], world, T0, cfg)
    share = planner.share
    assert len(taken) <= budget
    assert len(set(taken)) == len(taken)
    got = {space: sum(1 for s, _ in taken if s == space) for space in spaces}
    if len(spaces) <= budget:
        assert share == (budget // len(spaces) if spaces else 0)
        for space in spaces:
            assert got[space] >= min(share, counts[space])
        # And nothing is left on the table: the pass spends all it can from what was listed.
        listed = sum(min(10 * share, counts[space]) for space in spaces)
        assert len(taken) == min(budget, listed)
    else:
        # One each, in rotation order, to the namespaces with someone behind, until the budget
        # is spent (leftovers of empty namespaces go to the ones that took their one).
        assert share == 1
        with_users = [space for space in sorted(spaces) if counts[space]]
        for space in with_users[:budget]:
            assert got[space] >= 1


@given(
    st.integers(min_value=1, max_value=30),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=0, max_value=29),
)
@hsettings(max_examples=200, deadline=None)
def test_the_rotation_reaches_every_namespace(count: int, budget: int, cursor_at: int) -> None:
    spaces = [f"ns{i:02d}" for i in range(count)]
    cfg = PlannerSettings(max_users_per_pass=budget)
    world = World(behind={space: users(f"{space}-", 100) for space in spaces})
    state = PlannerState(cursor=spaces[cursor_at % count])
    served: set[str] = set()
    passes = math.ceil(count / min(count, budget))
    now = T0
    for _ in range(passes):
        state, delay, taken, _ = run_pass(state, [ns(s) for s in spaces], world, now, cfg)
        served |= {space for space, _ in taken}
        now += delay
    assert served == set(spaces)


outcomes = st.sampled_from(list(Outcome))


@given(
    worlds(),
    st.lists(outcomes, min_size=1, max_size=40),
    st.lists(st.floats(min_value=0, max_value=2000), min_size=6, max_size=6),
    st.floats(min_value=0, max_value=150),
)
@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_passes_keep_the_budget_no_repeats_and_every_wait(
    world_spec: tuple[list[str], dict[str, list[str]], int],
    outcome_cycle: list[Outcome],
    gaps: list[float],
    build_seconds: float,
) -> None:
    spaces, behind, budget = world_spec
    cfg = PlannerSettings(max_users_per_pass=budget)
    spec = [ns(s) for s in spaces]
    turn = iter(range(10**9))

    def outcome(_ns: str, _user: str) -> Outcome:
        return outcome_cycle[next(turn) % len(outcome_cycle)]

    world = World(behind={space: list(listed) for space, listed in behind.items()}, outcome=outcome)
    waits: dict[tuple[str, str], float] = {}
    state = PlannerState(generation=1)
    now = T0
    for gap in gaps:
        planner = PassPlanner(state, spec, cfg, now)
        started = now
        seen: set[tuple[str, str]] = set()
        while (step := planner.next_step(now)) is not None:
            assert now - started < cfg.max_pass_seconds / 2
            if isinstance(step, ScanStep):
                for pair, until in waits.items():
                    if pair[0] == step.namespace and now < until:
                        assert pair[1] in step.excluded
                planner.record_scan(step.namespace, world.scan(step), now)
                continue
            pair = (step.namespace, step.user_id)
            assert pair not in seen
            seen.add(pair)
            assert now >= waits.get(pair, -math.inf), "a user was handed out during its wait"
            result = world.outcome(*pair)
            if result not in (Outcome.FAILED, Outcome.DEFERRED):  # deferred: still behind
                world.behind[step.namespace].remove(step.user_id)
            planner.record_result(*pair, result, now, FP)
            if result is Outcome.FAILED:
                wait = planner.snapshot().user_waits[pair[0]][pair[1]]
                assert wait.backoff_until is not None
                assert cfg.backoff_base_seconds <= wait.backoff_until - now
                assert wait.backoff_until - now <= cfg.backoff_cap_seconds
                waits[pair] = wait.backoff_until
            else:
                waits.pop(pair, None)
            now += build_seconds
        assert len(seen) <= budget
        state, delay = planner.finish(now)
        assert delay in (cfg.interval_seconds, cfg.idle_interval_seconds)
        assert PlannerState.from_json(state.to_json()) == state
        now += delay + gap
