"""The reference scheduler survives the scheduler-level stateful machine (30% fault rate)."""

from oracle.scheduler_machine import SchedulerMachine

TestReferenceScheduler = SchedulerMachine.TestCase
