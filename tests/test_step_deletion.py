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


def test_every_replay_is_of_a_strictly_shorter_program_and_offsets_are_a_run_apart_when_costly() -> None:
    tried: list[int] = []

    def fails(program: list[int]) -> bool:
        tried.append(len(program))
        return 7 in program

    program = list(range(40))
    assert delete_runs(program, fails, short=0) == [7]
    assert all(n < 40 for n in tried)
    assert len(tried) <= 2 * 40  # about one replay per step at each run length


def test_a_program_none_of_whose_steps_is_needed_is_emptied() -> None:
    assert delete_runs(["x"], lambda program: True) == []
    assert delete_runs([], lambda program: True) == []
    assert delete_runs(["x", "y"], lambda program: False) == ["x", "y"]
