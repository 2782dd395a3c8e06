"""The one core behind the sync and the async SDK: calls, programs, and methods that run them.

Every SDK method is written once, as a function that *describes* what to send:

- a ``Call``: one op with its body (``bot.working_memory.set`` builds one), or
- a ``Program``: a generator that yields ``Call``s and is sent their answers (or has their
  ``LoomError`` thrown in), for logic that spans calls (the agent-state client's queue).

Neither does any I/O. A *runner* does: ``loom.transport.Transport`` runs a program to its end
on ``requests`` and returns its value; ``loom.transport.AsyncTransport`` does the same on
``httpx`` and returns a coroutine. Those two runners are the only code written twice.

``@sends`` (for a function returning a ``Call``) and ``@runs`` (for a ``Program``) turn such a
function into a method of a ``Face``. The method's type follows its face's mode: on a
``Face[Sync]`` it answers ``T``; on a ``Face[Async]`` it answers ``Awaitable[T]``. So
``bot.working_memory.set(...)`` is typed for both forms from one definition.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

T = TypeVar("T")
P = ParamSpec("P")


class Sync:
    """The mode of a face whose methods answer at once (``with Agent(...)``)."""


class Async:
    """The mode of a face whose methods answer awaitables (``async with Agent(...)``)."""


M = TypeVar("M", Sync, Async)


def _as_is(answer: dict[str, Any]) -> Any:
    return answer


@dataclass(frozen=True)
class Call(Generic[T]):
    """One op to send: its name, body, kind (retry safety), REST route and timeout.

    ``then`` turns the answer dict into what the method returns (``Rendered`` for a render);
    by default the dict itself, typed as the op's generated answer ``TypedDict``.
    """

    op: str
    body: Mapping[str, Any]
    kind: str = "write"
    http_method: str = "POST"
    path: str | None = None
    timeout: float | None = None
    then: Callable[[dict[str, Any]], T] = field(default=_as_is, repr=False)


# A program yields calls, is sent each answer (after ``then``), and returns its result.
Program = Generator[Call[Any], Any, T]


def single(call: Call[T]) -> Program[T]:
    """The program of one call: send it, answer what it answered."""
    answer: T = yield call
    return answer


class Runner(Protocol[M]):
    """What runs programs for a face: ``loom.transport.Transport`` or ``AsyncTransport``."""

    mode: type[M]

    def run(self, program: Program[Any], *, exclusive: bool = False) -> Any: ...


class Face(Generic[M]):
    """Anything with methods made by ``@sends`` / ``@runs``: it holds the runner."""

    _runner: Runner[M]


class Method(Generic[P, T]):
    """A method made from a call- or program-building function (see the module doc)."""

    def __init__(
        self, build: Callable[Concatenate[Any, P], Program[T]], *, exclusive: bool,
        doc_of: Callable[..., Any],
    ) -> None:
        self._build = build
        self._exclusive = exclusive
        self._doc_of = doc_of
        self.__doc__ = doc_of.__doc__

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None) -> Method[P, T]: ...

    @overload
    def __get__(self, obj: Face[Sync], owner: type[Any] | None = None) -> Callable[P, T]: ...

    @overload
    def __get__(
        self, obj: Face[Async], owner: type[Any] | None = None
    ) -> Callable[P, Awaitable[T]]: ...

    def __get__(self, obj: Face[Any] | None, owner: type[Any] | None = None) -> Any:
        if obj is None:
            return self
        build, exclusive, runner = self._build, self._exclusive, obj._runner

        @functools.wraps(self._doc_of)
        def bound(*args: Any, **kwargs: Any) -> Any:
            return runner.run(build(obj, *args, **kwargs), exclusive=exclusive)

        return bound


def sends(build: Callable[Concatenate[Any, P], Call[T]]) -> Method[P, T]:
    """A method from a function that builds one ``Call``."""

    def program(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> Program[T]:
        return single(build(self, *args, **kwargs))

    return Method(program, exclusive=False, doc_of=build)


def runs(build: Callable[Concatenate[Any, P], Program[T]]) -> Method[P, T]:
    """A method from a generator function yielding ``Call``s (a ``Program``)."""
    return Method(build, exclusive=False, doc_of=build)


def runs_locked(build: Callable[Concatenate[Any, P], Program[T]]) -> Method[P, T]:
    """``runs``, under the runner's lock (a ``threading.RLock`` or an ``asyncio.Lock``), so
    programs that share state (the agent-state queue) keep their order."""
    return Method(build, exclusive=True, doc_of=build)


def run_sync(program: Program[T], send: Callable[[Call[Any]], Any]) -> T:
    """Drive ``program`` with a blocking ``send``; errors of ``send`` are thrown into it."""
    try:
        call = next(program)
        while True:
            try:
                answer = call.then(send(call))
            except BaseException as error:  # noqa: B036 - handed to the program, which may catch
                call = program.throw(error)
            else:
                call = program.send(answer)
    except StopIteration as done:
        result: T = done.value
        return result


async def run_async(program: Program[T], send: Callable[[Call[Any]], Awaitable[Any]]) -> T:
    """``run_sync`` with an awaitable ``send``."""
    try:
        call = next(program)
        while True:
            try:
                answer = call.then(await send(call))
            except BaseException as error:  # noqa: B036 - handed to the program, which may catch
                call = program.throw(error)
            else:
                call = program.send(answer)
    except StopIteration as done:
        result: T = done.value
        return result
