"""Every built-in task, registered: import this module to have their problems in
:data:`gpdyn.data.problems.PROBLEMS` (the command line's problem names read it)."""

from gpdyn.data.problems import PROBLEMS
from gpdyn.robots.task import TASKS, get_task, load_builtin_tasks

load_builtin_tasks()

__all__ = ["PROBLEMS", "TASKS", "get_task"]
