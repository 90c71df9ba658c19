"""The shared budget of big answers: bounded in all, never built while waiting, never stuck."""

from __future__ import annotations

import anyio
import pytest

from substrate_gpu.service.lines import SMALL_ANSWER, AnswerBudget

pytestmark = pytest.mark.anyio

BIG = b"x" * (SMALL_ANSWER + 1)


async def test_an_answer_larger_than_the_whole_budget_is_sent_alone():
    """Nothing else held: it gets through (else it would wait for ever)."""
    budget = AnswerBudget(SMALL_ANSWER)
    async with budget.held(lambda: BIG * 4) as answer:
        assert len(answer) == len(BIG) * 4
        assert budget.used == len(answer)
    assert budget.used == 0


async def test_small_answers_never_touch_the_budget():
    """Not even when a big list holds it all: an actor's state is answered at once."""
    budget = AnswerBudget(SMALL_ANSWER)
    big = budget.held(lambda: BIG * 2, like_last=True)
    async with big, budget.held(lambda: b"ok\n") as small:
        assert small == b"ok\n"
        assert budget.used == len(BIG) * 2


@pytest.mark.parametrize(
    ("like_last", "built"),
    [
        pytest.param(False, 2, id="built-once-to-learn-its-size-then-again-once-it-fits"),
        pytest.param(True, 1, id="a-list-like-the-last-waits-before-it-is-built"),
    ],
)
async def test_an_answer_that_does_not_fit_waits_holding_nothing(like_last, built):
    """The second answer waits until the first gave its bytes back, dropped while it waits."""
    budget = AnswerBudget(len(BIG) + 10)
    builds: list[float] = []
    released = anyio.Event()

    def build() -> bytes:
        builds.append(anyio.current_time())
        return BIG

    async def second() -> None:
        async with budget.held(build, like_last=like_last) as answer:
            assert released.is_set()
            assert budget.used == len(answer)

    async with anyio.create_task_group() as tasks:
        async with budget.held(lambda: BIG, like_last=True):
            tasks.start_soon(second)
            await anyio.sleep(0.05)
            assert len(builds) == built - 1  # waiting, it builds nothing more
            released.set()
    assert len(builds) == built
    assert budget.used == 0
