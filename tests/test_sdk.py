"""The sync SDK against the real app: working memory, errors, transport failures, the manifest.

Most tests mount ``tests.support.wsgi_adapter.FlaskAdapter`` on the Agent's session, so each
call runs the real Flask app over the real Redis without a socket; one test runs the seed's
example against gunicorn. Profile and memory methods are checked for what they send (their ops
are being built elsewhere) with a recording adapter, and for real once ``profile.set`` exists.
"""

from __future__ import annotations

import ast
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import requests
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict

import app.errors as server_errors
from app import sdk_errors
from app import sdk_manifest as manifest
from app.local import free_port
from app.ops import load_ops
from loom import Agent, Rendered, __version__, errors
from loom.client import OpMethod
from loom.ops_manifest import OPS
from tests.support.stepped_time import SteppedTime
from tests.support.wsgi_adapter import FlaskAdapter

ROOT = Path(__file__).resolve().parents[1]
BASE = "http://loom.test"
# Auth off, every call acts in the install's org: the answers name "org" in ignored_args.
WHO = {"org": "acme", "namespace": "support", "agent": "triage-bot"}


@pytest.fixture
def adapter(app) -> FlaskAdapter:
    return FlaskAdapter(app)


def mounted(adapter: BaseAdapter, *, stepped: SteppedTime | None = None,
            **options: Any) -> Agent:
    """An Agent whose calls go to ``adapter`` and whose retries wait on ``stepped`` (a fresh
    ``SteppedTime`` when not given): recorded, never slept."""
    bot = Agent(**{**WHO, "base_url": BASE, **options})
    bot.transport.session.mount(BASE, adapter)
    return (stepped if stepped is not None else SteppedTime()).install(bot)


@pytest.fixture
def bot(adapter: FlaskAdapter) -> Iterator[Agent]:
    with mounted(adapter) as agent:
        yield agent


class Recorder(BaseAdapter):
    """Answers every request with ``answer`` and keeps what was sent (forwarding tests only)."""

    def __init__(self, answer: Any = None, status: int = 200, text: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__()
        self.answer = {"ok": True} if answer is None else answer
        self.status = status
        self.text = text
        self.headers = headers or {}
        self.sent: list[requests.PreparedRequest] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        self.sent.append(request)
        response = requests.Response()
        response.status_code = self.status
        response._content = (self.text if self.text is not None
                             else json.dumps(self.answer)).encode()
        response.headers = CaseInsensitiveDict(
            {"Content-Type": "application/json", **self.headers})
        response.request = request
        response.url = request.url or ""
        return response

    def close(self) -> None:
        pass

    @property
    def last(self) -> tuple[str, dict[str, Any]]:
        request = self.sent[-1]
        path = (request.url or "").removeprefix(BASE)
        return path, json.loads(request.body) if request.body else {}


# --- working memory, method by method ---------------------------------------------------------


def test_seed_example_renders_the_block_as_xml(bot: Agent):
    bot.working_memory.set(
        "cursor: ticket 4812\nlease: holds refunds queue", block_key="state", run_id="run-7"
    )
    bot.working_memory.append("step 3 done", block_key="state", run_id="run-7")
    rendered = bot.working_memory.render(run_id="run-7")
    assert isinstance(rendered, Rendered) and isinstance(rendered, str)
    assert rendered == (
        '<working-memory block="state">cursor: ticket 4812\nlease: holds refunds queue\n'
        "step 3 done</working-memory>"
    )
    assert str(rendered) == rendered.answer["rendered"]
    assert rendered.answer["block_count"] == 1
    assert rendered.answer["blocks"][0]["block_key"] == "state"


def test_set_answers_size_and_fill_ratio(bot: Agent):
    written = bot.working_memory.set("x" * 1024)
    assert written["block_key"] == "scratchpad"
    assert written["value_length"] == 1024
    assert written["char_limit"] == 4096
    assert written["fill_ratio"] == 0.25
    capped = bot.working_memory.set("abc", "small", char_limit=10)
    assert capped["char_limit"] == 10 and capped["fill_ratio"] == 0.3
    assert capped["version"] > 0


def test_append_uses_the_separator_and_creates_a_missing_block(bot: Agent):
    first = bot.working_memory.append("a", block_key="log", separator=" | ")
    bot.working_memory.append("b", block_key="log", separator=" | ")
    assert first["value_length"] == 1
    assert bot.working_memory.get("log")["content"] == "a | b"


def test_replace_rewrites_every_occurrence_and_new_defaults_to_deleting(bot: Agent):
    bot.working_memory.set("ticket 4812, then 4812 again", block_key="state")
    bot.working_memory.replace("4812", "4813", block_key="state")
    assert bot.working_memory.get("state")["content"] == "ticket 4813, then 4813 again"
    bot.working_memory.replace(", then 4813 again", block_key="state")
    assert bot.working_memory.get(block_key="state")["content"] == "ticket 4813"


def test_get_reports_found_and_missing(bot: Agent):
    missing = bot.working_memory.get("nothing-here")
    assert missing["found"] is False and missing["content"] == "" and missing["version"] == 0
    bot.working_memory.set("hello", block_key="here", user_id="u-42")
    assert bot.working_memory.get("here")["found"] is False  # another user's scope
    found = bot.working_memory.get("here", user_id="u-42")
    assert found["found"] is True and found["content"] == "hello"


def test_delete_then_get_and_delete_again(bot: Agent):
    bot.working_memory.set("gone soon", block_key="tmp", session_id="s-1")
    assert bot.working_memory.delete("tmp", session_id="s-1") == {
        "deleted": True, "block_key": "tmp", "ignored_args": ["org"]
    }
    assert bot.working_memory.get("tmp", session_id="s-1")["found"] is False
    assert bot.working_memory.delete("tmp", session_id="s-1")["deleted"] is False


def test_render_markdown_block_keys_and_limit(bot: Agent):
    for key in ("c", "a", "b"):
        bot.working_memory.set(f"text {key}", block_key=key, run_id="run-9")
    markdown = bot.working_memory.render(run_id="run-9", format="markdown")
    assert markdown == "## a\ntext a\n\n## b\ntext b\n\n## c\ntext c"
    only = bot.working_memory.render(run_id="run-9", block_keys=["c", "a"])
    assert only.answer["block_count"] == 2 and "text b" not in only
    limited = bot.working_memory.render(run_id="run-9", limit=1)
    assert [block["block_key"] for block in limited.answer["blocks"]] == ["a"]
    assert bot.working_memory.render(run_id="run-other") == ""


# --- errors -----------------------------------------------------------------------------------


def test_over_limit_write_raises_with_value_length_and_char_limit(bot: Agent):
    bot.working_memory.set("keep", block_key="state", char_limit=10)
    with pytest.raises(errors.WorkingMemoryLimitExceeded) as caught:
        bot.working_memory.append("more than ten", block_key="state")
    error = caught.value
    assert error.status == 422 and error.code == "WORKING_MEMORY_LIMIT_EXCEEDED"
    assert error.value_length == len("keep\nmore than ten") and error.char_limit == 10
    assert isinstance(error, errors.LimitExceeded | errors.Unprocessable | errors.LoomAPIError)
    assert error.response is not None and error.response.status_code == 422
    assert "WORKING_MEMORY_LIMIT_EXCEEDED" in str(error)
    assert bot.working_memory.get("state")["content"] == "keep"


def test_replace_errors_map_to_their_classes(bot: Agent):
    with pytest.raises(errors.WorkingMemoryBlockNotFound) as missing:
        bot.working_memory.replace("a", "b", block_key="absent")
    assert missing.value.status == 404 and isinstance(missing.value, errors.NotFound)
    bot.working_memory.set("abc", block_key="state")
    with pytest.raises(errors.SubstringNotFound) as absent:
        bot.working_memory.replace("zzz", "y", block_key="state")
    assert absent.value.status == 422


def test_validation_errors_name_the_field(bot: Agent):
    with pytest.raises(errors.ValidationError) as caught:
        bot.working_memory.set("x", char_limit=16385)
    assert caught.value.code == "VALIDATION_ERROR" and "char_limit" in caught.value.fields
    with pytest.raises(errors.ValidationError) as long_key:
        bot.working_memory.get("k" * 81)
    assert "block_key" in long_key.value.fields
    with pytest.raises(errors.ValidationError) as wrong_type:
        bot.client.working_memory.render({"limit": "20"})
    assert "limit" in wrong_type.value.fields


def test_missing_namespace_is_identity_incomplete(adapter: FlaskAdapter):
    with mounted(adapter, namespace=None) as bot:
        with pytest.raises(errors.IdentityIncomplete) as caught:
            bot.working_memory.get()
    assert list(caught.value.details["fields"]) == ["namespace"]
    # The catalogue's detail, typed, and what to do, on the class of the code.
    assert caught.value.fields == {"namespace": ["namespace is required"]}
    assert caught.value.remedy == "fix_input"
    assert errors.IdentityIncomplete.default_status == 422


def test_a_refusal_carries_its_catalogue_details_as_typed_properties(adapter: FlaskAdapter):
    with mounted(adapter) as bot:
        bot.profile.set("tone", "hello")
        with pytest.raises(errors.HashMismatch) as caught:
            bot.profile.set("tone", "other", if_match_sha256="0" * 64)
    refused = caught.value
    assert refused.remedy == "read_then_resend"
    assert refused.key == "tone"
    assert refused.content_sha256 is not None and len(refused.content_sha256) == 64
    assert refused.retry_after is None


def test_an_op_the_server_lacks_raises_unknown_op(bot: Agent, adapter: FlaskAdapter):
    with pytest.raises(errors.UnknownOp) as caught:
        bot.client.working_memory.compact({})
    assert caught.value.status == 404
    assert adapter.sent[-1][0].path_url == "/v1/working_memory.compact"


def test_every_server_error_code_has_an_sdk_class_of_its_own():
    # Every subclass, wherever it is declared (the answer contract's lives in app/schemas).
    server_classes = []
    stack = list(server_errors.LoomError.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        server_classes.append(cls)
    assert len(server_classes) > 30
    for cls in server_classes:
        sdk_class = errors.error_class(cls.status, cls.code)
        assert errors.BY_CODE.get(cls.code) is sdk_class, f"no SDK class for {cls.code}"
        assert sdk_class.default_code == cls.code, f"{cls.code} shares {sdk_class.__name__}"
        group = errors.BY_STATUS.get(cls.status)
        if group is not None:
            assert issubclass(sdk_class, group), (cls.code, sdk_class, group)


def test_unknown_codes_fall_back_to_the_status_class():
    error = errors.error_from_answer(409, {"code": "SOMETHING_NEW", "message": "m", "x": 1})
    assert type(error) is errors.Conflict and error.code == "SOMETHING_NEW"
    assert error.details == {"x": 1}
    assert type(errors.error_from_answer(418, None)) is errors.LoomAPIError


def test_non_json_server_error_and_rate_limit_header():
    proxy = Recorder(status=502, text="<html>Bad Gateway</html>")
    with mounted(proxy) as bot, pytest.raises(errors.ServerError) as caught:
        bot.working_memory.get()
    assert caught.value.status == 502 and caught.value.code == "HTTP_502"
    limited = Recorder(
        {"error": {"code": "RATE_LIMITED", "message": "slow down"}}, status=429,
        headers={"Retry-After": "3"},
    )
    stepped = SteppedTime()
    with mounted(limited, stepped=stepped) as bot, \
            pytest.raises(errors.RateLimited) as caught_limit:
        bot.working_memory.get()
    assert caught_limit.value.retry_after == 3.0
    # A read waits out the Retry-After the server asked for, then gives up after three tries.
    assert stepped.slept == [3.0, 3.0] and len(limited.sent) == 3
    garbled = Recorder(text="[1, 2]")
    with mounted(garbled) as bot, pytest.raises(errors.LoomAPIError) as caught_answer:
        bot.working_memory.get()
    assert caught_answer.value.code == "INVALID_ANSWER"


def _accepted(listener: socket.socket) -> int:
    """How many connections wait in ``listener``'s backlog (each closed once counted)."""
    listener.setblocking(False)
    count = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def test_a_silent_server_times_out_as_loom_timeout():
    """The call ends because each try's read timeout fired and the tries ran out: three tries
    (one connection each), two waits between them; the timeout each try was given is
    ``test_every_call_carries_a_timeout_and_the_client_header``'s part."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # the kernel completes the handshake; nobody ever answers
    port = listener.getsockname()[1]
    stepped = SteppedTime()
    try:
        with stepped.install(Agent(**WHO, base_url=f"http://127.0.0.1:{port}",
                                   timeout=0.3)) as bot:
            with pytest.raises(errors.LoomTimeout) as caught:
                bot.working_memory.get()
            assert len(stepped.slept) == 2 and _accepted(listener) == 3
            with pytest.raises(errors.LoomTimeout):
                bot.working_memory.get(timeout=0.1)
            assert len(stepped.slept) == 4 and _accepted(listener) == 3
    finally:
        listener.close()
    error = caught.value
    assert error.status is None and error.code == "TIMEOUT"
    assert isinstance(error, errors.LoomTransportError)
    assert isinstance(error.__cause__, requests.ReadTimeout)
    assert error.may_have_reached_server  # sent, then no answer: not a connect timeout


def test_a_refused_connection_is_loom_connection_error():
    port = free_port()  # bound and released: nothing listens there
    stepped = SteppedTime()
    with stepped.install(Agent(**WHO, base_url=f"http://127.0.0.1:{port}", timeout=2)) as bot:
        with pytest.raises(errors.LoomConnectionError) as caught:
            bot.working_memory.set("x")
    assert len(stepped.slept) == 2  # never sent, so tried again: three tries in all
    assert not isinstance(caught.value, errors.LoomTimeout)
    assert caught.value.code == "CONNECTION_ERROR" and caught.value.status is None
    assert isinstance(caught.value.__cause__, requests.ConnectionError)


def test_timeout_must_be_positive():
    with pytest.raises(ValueError):
        Agent(**WHO, timeout=0)


# --- transport: identity, headers, timeouts ---------------------------------------------------


def test_every_call_carries_a_timeout_and_the_client_header(adapter: FlaskAdapter):
    with mounted(adapter, timeout=4.0) as bot:
        bot.working_memory.set("x")
        bot.working_memory.get(timeout=1.5)
        bot.client.working_memory.render({}, timeout=2.5)
    timeouts = [kwargs["timeout"] for _, kwargs in adapter.sent]
    assert timeouts == [4.0, 1.5, 2.5]
    for request, _ in adapter.sent:
        assert request.headers["X-Loom-Client"] == f"loom-python/{__version__}"
        assert "Authorization" not in request.headers


def test_api_key_and_base_url_come_from_arguments_or_env(monkeypatch: pytest.MonkeyPatch):
    recorder = Recorder()
    with mounted(recorder, api_key="tok-1") as bot:
        bot.working_memory.get()
    assert recorder.sent[-1].headers["Authorization"] == "Bearer tok-1"
    monkeypatch.setenv("LOOM_API_KEY", "tok-env")
    monkeypatch.setenv("LOOM_API_URL", BASE + "/")
    with Agent(**WHO) as bot:
        assert bot.transport.base_url == BASE
        bot.transport.session.mount(BASE, recorder)
        bot.working_memory.get()
    assert recorder.sent[-1].headers["Authorization"] == "Bearer tok-env"
    monkeypatch.delenv("LOOM_API_URL")
    with Agent(**WHO) as bot:
        assert bot.transport.base_url == "http://127.0.0.1:8000"


def test_sdk_version_is_the_one_its_distribution_reads():
    text = (ROOT / "sdk" / "pyproject.toml").read_text()
    assert 'path = "loom/_version.py"' in text
    assert (ROOT / "sdk" / "loom" / "_version.py").read_text().count(f'"{__version__}"') == 1


# --- the generic client -----------------------------------------------------------------------


def test_generic_client_calls_any_registry_op(bot: Agent):
    written = bot.client.working_memory.set({"block_key": "g", "content": "generic"})
    assert written["value_length"] == 7 and written["ignored_args"] == ["org"]
    assert bot.working_memory.get("g")["content"] == "generic"
    assert bot.client.call("working_memory.get", {"block_key": "g"})["found"] is True


def test_the_body_wins_over_the_agents_identity(bot: Agent, adapter: FlaskAdapter):
    bot.client.working_memory.set({"agent": "other-bot", "block_key": "b", "content": "theirs"})
    assert bot.working_memory.get("b")["found"] is False
    assert bot.client.working_memory.get({"agent": "other-bot", "block_key": "b"})["found"]
    body = json.loads(adapter.sent[-1][0].body)
    assert body == {"org": "acme", "namespace": "support", "agent": "other-bot",
                    "block_key": "b"}


def test_unknown_fields_are_sent_and_named_in_ignored_args(bot: Agent):
    answer = bot.client.working_memory.get({"block_key": "x", "colour": "blue"})
    assert answer["ignored_args"] == ["colour", "org"]


def test_dir_lists_ops_and_typos_suggest_the_known_name(bot: Agent):
    assert {"append", "delete", "get", "render", "replace", "set"} <= set(
        dir(bot.client.working_memory))
    assert "working_memory" in dir(bot.client)
    with pytest.raises(AttributeError, match="did you mean 'set'"):
        bot.client.working_memory.sett  # noqa: B018
    with pytest.raises(AttributeError, match="did you mean 'working_memory'"):
        bot.client.workin_memory  # noqa: B018
    with pytest.raises(AttributeError, match="did you mean 'render'"):
        bot.client.working_memory.rendr  # noqa: B018
    assert not hasattr(bot.client, "_private")
    assert "Overwrite one working-memory block" in bot.client.working_memory.set.__doc__
    assert "block_key = 'scratchpad'" in bot.client.working_memory.set.__doc__
    with pytest.raises(TypeError):
        bot.client.working_memory.set("not a dict")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        bot.client.call("working_memory_set", {})


# --- profile, memory and context: what they send ----------------------------------------------


def test_profile_methods_send_the_seed_ops_and_fields():
    recorder = Recorder({"rendered": "<profile/>", "section_count": 1})
    with mounted(recorder) as bot:
        bot.profile.set("persona", "Terse. Cite ticket ids.")
        assert recorder.last == ("/v1/profile.set", {
            **WHO, "label": "persona", "value": "Terse. Cite ticket ids."})
        bot.profile.append("preferences", "Prefers EUR invoices.", user_id="u-42")
        assert recorder.last == ("/v1/profile.append", {
            **WHO, "label": "preferences", "addition": "Prefers EUR invoices.",
            "separator": "\n", "user_id": "u-42"})
        bot.profile.replace("persona", "Terse", "Brief")
        assert recorder.last == ("/v1/profile.replace", {
            **WHO, "label": "persona", "old": "Terse", "new": "Brief"})
        system = bot.profile.render(user_id="u-42", read_scope="own_user")
        assert system == "<profile/>" and system.answer["section_count"] == 1
        assert recorder.last == ("/v1/profile.render", {
            **WHO, "user_id": "u-42", "read_scope": "own_user", "format": "xml"})
        bot.profile.activity(lookback_days=3)
        assert recorder.last == ("/v1/profile.activity", {**WHO, "lookback_days": 3})
        bot.profile.structured(user_id="u-42")
        assert recorder.last == ("/v1/profile.structured", {**WHO, "user_id": "u-42"})
        bot.profile.get("persona")
        assert recorder.last == ("/v1/memory.get", {
            **WHO, "memory_type": "profile", "key": "persona"})
        bot.profile.list(user_id="u-42")
        assert recorder.last == ("/v1/memory.list", {
            **WHO, "memory_type": "profile", "user_id": "u-42"})
        bot.profile.delete("persona")
        assert recorder.last == ("/v1/memory.delete", {
            **WHO, "memory_type": "profile", "key": "persona"})


def test_memory_and_context_take_keyword_fields():
    recorder = Recorder()
    with mounted(recorder) as bot:
        bot.memory.set(key="tz", value="Europe/Berlin", memory_type="preference")
        assert recorder.last == ("/v1/memory.set", {
            **WHO, "key": "tz", "value": "Europe/Berlin", "memory_type": "preference"})
        bot.context.pack(query="refund policy", run_id="run-7", timeout=3)
        assert recorder.last == ("/v1/context.pack", {
            **WHO, "query": "refund policy", "run_id": "run-7"})
        bot.client.profile_schema.set({"json_schema": {"type": "object"}})
        assert recorder.last == ("/v1/profile_schema.set", {
            **WHO, "json_schema": {"type": "object"}})


@pytest.mark.skipif(
    not all(name in load_ops() for name in ("profile.set", "memory.get", "memory.list")),
    reason="profile.* and memory.* ops not built yet",
)
def test_profile_methods_for_real(bot: Agent):
    written = bot.profile.set("persona", "Terse. Cite ticket ids. Never promise refunds.")
    assert written["label"] == "persona"
    bot.profile.append("preferences", "Prefers EUR invoices.", user_id="u-42")
    bot.profile.replace("persona", "Terse", "Brief")
    system = bot.profile.render(user_id="u-42", read_scope="own_user")
    assert "Brief. Cite ticket ids." in system and "Prefers EUR invoices." in system
    assert system.answer["section_count"] == 2
    with pytest.raises(errors.HashMismatch):
        bot.profile.set("persona", "x", if_match_sha256="0" * 64)
    with pytest.raises(errors.SubstringNotFound):
        bot.profile.replace("persona", "absent text", "y")
    assert "Brief" in json.dumps(bot.profile.get("persona"))
    assert "persona" in json.dumps(bot.profile.list())
    assert "Prefers EUR" in json.dumps(bot.profile.list(user_id="u-42"))
    bot.profile.delete("persona")
    assert "persona" not in bot.profile.render(user_id="u-42").answer["labels"]


# --- over a real socket -----------------------------------------------------------------------


@pytest.mark.slow
def test_seed_example_against_gunicorn(live_server):
    with Agent(**WHO, base_url=live_server.url) as bot:
        bot.working_memory.set(
            "cursor: ticket 4812\nlease: holds refunds queue", block_key="state", run_id="run-7"
        )
        bot.working_memory.append("step 3 done", block_key="state", run_id="run-7")
        rendered = bot.working_memory.render(run_id="run-7")
        assert rendered.startswith('<working-memory block="state">cursor: ticket 4812')
        with pytest.raises(errors.WorkingMemoryLimitExceeded):
            bot.working_memory.set("x" * 5000, block_key="state", run_id="run-7")


# --- the manifest -----------------------------------------------------------------------------


def test_every_committed_sdk_file_equals_a_fresh_generation():
    files = manifest.generated_files()
    assert set(files) == {manifest.MANIFEST_PATH, manifest.ANSWERS_PATH, sdk_errors.PYTHON_PATH}
    for path, fresh in files.items():
        assert path.read_text() == fresh, (
            f"the op registry or the error catalogue changed: run `python -m app.sdk_manifest` "
            f"({path.name})"
        )


def test_manifest_covers_the_registry_with_valid_input_schemas():
    registry = load_ops()
    ops = OPS
    assert sorted(ops) == [declared.name for declared in registry]
    for declared in registry:
        entry = ops[declared.name]
        assert (entry["role"], entry["kind"], entry["listed"], entry["mcp"]) == (
            declared.role, declared.kind, declared.listed, declared.mcp)
        jsonschema.Draft202012Validator.check_schema(entry["input_schema"])
        fields = set(declared.args().load_fields)
        assert set(entry["input_schema"]["properties"]) == fields == set(entry["fields"])
    assert ops["working_memory.append"]["fields"]["addition"] == {"required": True}
    assert ops["working_memory.set"]["fields"]["block_key"] == {
        "required": False, "default": "scratchpad"}
    validator = jsonschema.Draft202012Validator(ops["working_memory.set"]["input_schema"])
    assert validator.is_valid({"content": "x", "namespace": None})
    assert not validator.is_valid({"char_limit": "20"})


def test_manifest_layout_keeps_long_values_within_the_line_limit():
    data = {"op.x": {"summary": "word " * 60, "nested": {"list": ["y" * 30] * 6}, "n": None}}
    text = manifest._literal(data, 0, 20)
    assert ast.literal_eval(text) == data
    assert max(len(line) for line in text.splitlines()) + 20 <= 120
    assert all(len(line) <= 100 for line in text.splitlines()[1:])


def test_the_sdk_imports_neither_flask_nor_the_server():
    code = (
        "import sys, loom, loom.client, loom.planes, loom.errors, loom.ops_manifest\n"
        "from loom import Agent\n"
        "Agent(org='a', namespace='n', agent='x').client.working_memory.set\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('flask', 'app', 'marshmallow', 'werkzeug', 'apispec', 'redis')]\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT / "sdk"), "PATH": "/usr/bin:/bin"},
    )
    assert done.stdout.strip() == ""


def test_ops_with_a_rest_path_fill_it_from_the_body():
    recorder = Recorder()
    entry = {"summary": "s", "role": "viewer", "kind": "read", "fields": {},
             "http_method": "GET", "path": "/v1/profiles/<profile_id>/agent-state"}
    with mounted(recorder) as bot:
        method = OpMethod(bot.transport, bot.identity, "agent_state.of_profile", entry)
        method({"profile_id": "u 42"})
    request = recorder.sent[-1]
    assert request.method == "GET" and request.body is None
    assert request.path_url == (
        "/v1/profiles/u%2042/agent-state?org=acme&namespace=support&agent=triage-bot")
