"""The one base class for errors caused by user input (bad file, shape, NaN, config).

The command line turns these into exit status 2 with the message; anything else is a
bug and keeps its traceback.
"""


class InputError(ValueError):
    """Bad input: the message says what is wrong and where (file, field, argument)."""
