"""The one step-deletion loop (oracle/step_deletion.py) that every shrinker of kvoracle's
runs: it keeps a program failing, deletes runs no single deletion can, and empties a
program whose steps are all unneeded."""

from kvoracle.oracle.step_deletion import delete_runs


def test_only_the_steps_the_failure_needs_are_left_in_their_order() -> None:
    def fails(program: list[str]) -> bool:
        return "a" in program and "b" in program[program.index("a"):]

    assert delete_runs(list("xaxxbxbx"), fails) == ["a", "b"]


def test_a_run_that_only_goes_as_a_whole_is_deleted() -> None:
    """Steps that cancel in pairs: deleting one alone changes the outcome, the pair does not."""
    def fails(program: list[str]) -> bool:
        return program.count("x") % 2 == 0 and "a" in program

    assert delete_runs(["x", "x", "a", "y"], fails) == ["a"]
    assert delete_runs(["a", "x", "x", "x", "x"], fails) == ["a"]


def test_a_costly_replay_tries_runs_a_runs_length_apart_a_short_program_every_offset() -> None:
    def replays(program: list[int], short: int) -> int:
        tried: list[list[int]] = []

        def fails(trial: list[int]) -> bool:
            tried.append(trial)
            return 7 in trial and 8 in trial

        assert delete_runs(program, fails, short=short) == [7, 8]
        return len(tried)

    program = list(range(40))
    assert replays(program, short=0) <= 2 * len(program)  # offsets a run apart: about two replays per step
    assert replays(program, short=0) < replays(program, short=len(program))  # every offset: more replays


def test_a_program_none_of_whose_steps_is_needed_is_emptied() -> None:
    assert delete_runs(["x"], lambda program: True) == []
    assert delete_runs([], lambda program: True) == []
    assert delete_runs(["x", "y"], lambda program: False) == ["x", "y"]
